// Messages typed while a turn streams. Enter (or Steer) sends the text as steering for the running reply,
// Alt+Enter (or Follow up) queues it for after the reply; both are `prompt` frames with a streamingBehavior.
// The server holds the queue and tells what it holds with `queue_update` frames, shown as chips above the
// composer; messages that Stop discarded (`dropped`) come back into the empty message box.
import { h, toast } from "./util.js";

const BUSY_HINT = "Steer the reply (Enter) or queue a follow-up (Alt+Enter)";

export function messageQueue(input, send) {
  const chips = h("div", { class: "queue", hidden: true, role: "list", "aria-label": "Queued messages" });
  const steer = h("button", { type: "button", class: "queue-steer", hidden: true, onclick: () => send("steer"),
    title: "Send this now: the model reads it before it goes on (Enter)" }, "Steer");
  const follow = h("button", { type: "button", class: "queue-follow", hidden: true, onclick: () => send("followUp"),
    title: "Send this when the reply is done (Alt+Enter)" }, "Follow up");
  const idleHint = input.placeholder;

  function chip(kind, text) {
    return h("span", { class: `chip ${kind === "Next" ? "next" : "steer"}`, role: "listitem", title: text },
      h("strong", {}, `${kind}: `), text);
  }

  return {
    chips,
    buttons: [steer, follow],
    busy(on) {
      steer.hidden = !on; follow.hidden = !on;
      input.placeholder = on ? BUSY_HINT : idleHint;
    },
    update(f) {
      const rows = [...(f.steering || []).map((t) => chip("Steering", t)), ...(f.followUp || []).map((t) => chip("Next", t))];
      chips.replaceChildren(...rows);
      chips.hidden = !rows.length;
      const dropped = (f.dropped || []).filter((t) => t && t.trim());
      if (!dropped.length) return;
      const text = dropped.join("\n\n");
      if (input.value.trim()) { toast(`Not sent: ${text}`); return; }
      input.value = text;
      input.dispatchEvent(new Event("input"));
    },
    clear() { chips.replaceChildren(); chips.hidden = true; },
  };
}
