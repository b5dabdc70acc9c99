// A chat tool call as a collapsible card: name, arguments, streamed output, result; and, while a gated call
// waits, the approval buttons (answered with an `approval` frame through `frame`).
import { h } from "./util.js";

export function toolCard(call, frame, live = false) {
  const status = h("span", { class: "tool-status" }, live ? "running…" : "");
  const args = h("pre", { class: "tool-args" }, fmtArgs(call.args));
  const out = h("pre", { class: "tool-output", hidden: true });
  const result = h("pre", { class: "tool-result", hidden: true });
  const approval = h("div", { class: "tool-approval", role: "group", "aria-label": `Approve ${call.tool}?`, hidden: true });
  const el = h("details", { class: "toolcard running", open: live || null, "data-call": call.callId },
    h("summary", {}, h("span", { class: "tool-name" }, call.tool), status), args, approval, out, result);
  const answer = (decision, alwaysAllow = false) => {
    frame({ type: "approval", callId: call.callId, decision, alwaysAllow });
    approval.hidden = true; el.classList.remove("asking");
    status.textContent = decision === "allow" ? "running…" : "denied";
  };
  return {
    el,
    ask(newArgs) {
      if (newArgs !== undefined) args.textContent = fmtArgs(newArgs);
      el.open = true; el.classList.add("asking"); status.textContent = "waiting for approval";
      const allow = h("button", { type: "button", class: "primary", onclick: () => answer("allow") }, "Allow");
      approval.replaceChildren(h("span", { class: "small" }, `Run ${call.tool}?`), allow,
        h("button", { type: "button", onclick: () => answer("deny") }, "Deny"),
        h("button", { type: "button", onclick: () => answer("allow", true),
          title: `Run ${call.tool} without asking for the rest of this chat (revoke it in the bar below or in Settings)` },
        "Always allow"));
      approval.hidden = false;
      approval.onkeydown = (e) => { if (e.key === "Escape") { e.preventDefault(); answer("deny"); } };
      allow.focus();
    },
    answered(decision) {
      approval.hidden = true; el.classList.remove("asking");
      status.textContent = decision === "allow" ? "running…" : "denied";
    },
    output(chunk) { out.hidden = false; out.textContent += chunk; out.scrollTop = out.scrollHeight; },
    end(ok, text) {
      approval.hidden = true;
      el.classList.remove("running", "asking");
      el.classList.add(ok ? "ok" : "failed");
      status.textContent = ok ? "done" : "error";
      result.hidden = false; result.textContent = text ?? "";
      if (ok) out.hidden = true;  // the result holds the output in full
    },
  };
}

export function fmtArgs(args) {
  return typeof args === "string" ? args : JSON.stringify(args ?? {}, null, 2);
}
