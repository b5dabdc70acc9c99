// Chat over /ws/chat: sessions, streaming replies, thinking, branches, tool calls and approvals, messages
// queued while a turn streams. One chat lives for the whole app (dock.js shows it on #/chat or in the dock):
// its socket stays open across pages. A turn runs on the server whether or not a socket follows it: a reload,
// a dropped connection or a tab that comes back opens the last chat again and receives its running turn from
// the first frame. `hooks.onReady` runs after each ready frame, `hooks.onBusy(on)` when a turn starts or ends;
// frames the chat does not know go to `hooks.onFrame`.
import { api, h, signIn, toast } from "./util.js";
import { markdown } from "./md.js";
import { imageAttacher, turnImages } from "./chat_images.js";
import { samplingFields, samplingPanel } from "./chat_settings.js";
import { importButton, sessionMenu } from "./session_actions.js";
import { speechInput } from "./speech.js";
import { toolCard } from "./chat_toolcard.js";
import { messageQueue } from "./chat_queue.js";
import { perfStrip } from "./chat_perf.js";

const LAST_CHAT = "hearth.chat.active";  // the chat to open again after a reload
const LIVE_POLL_MS = 2000;

function remembered() {
  try { return localStorage.getItem(LAST_CHAT); } catch { return null; }
}

function remember(id) {
  try { if (id) localStorage.setItem(LAST_CHAT, id); else localStorage.removeItem(LAST_CHAT); } catch { /* private mode */ }
}

export function createChat(hooks = {}) {
  const state = { ws: null, ready: null, active: remembered(), streaming: null, items: [], retry: 0,
    sessions: [], live: new Set() };
  const sessionsList = h("ul", { class: "sessions", "aria-label": "Chat sessions" });
  const hits = h("div", { class: "hits", "aria-live": "polite" });
  const search = h("input", { type: "search", placeholder: "Search chats", "aria-label": "Search chats" });
  const messages = h("div", { class: "messages", "aria-live": "polite", "aria-label": "Conversation" });
  // The conversation follows its end while the view is there: scrolling up to read stops that (a streaming
  // reply no longer pulls the view down) until the view is back at the end, by hand or with "Latest".
  let pinned = true;
  const jump = h("button", { type: "button", class: "jump small", hidden: true, "aria-label": "Scroll to the latest message",
    onclick: () => { pinned = true; follow(); } }, "↓ Latest");
  messages.addEventListener("scroll", () => {
    pinned = messages.scrollHeight - messages.scrollTop - messages.clientHeight < 40;
    jump.hidden = pinned;
  });
  function follow() {
    if (pinned) messages.scrollTop = messages.scrollHeight;
    jump.hidden = pinned;
  }
  const input = h("textarea", { rows: 2, placeholder: "Message the model (Enter sends, Shift+Enter adds a line)",
    "aria-label": "Message", "data-spot": "chat-input" });
  const send = h("button", { class: "primary", type: "submit" }, "Send");
  const stop = h("button", { type: "button", hidden: true, onclick: () => frame({ type: "abort" }) }, "Stop");
  const modelName = h("span", { class: "muted small" }, "connecting…");
  const ctx = h("span", { class: "ctx small muted", "aria-label": "Context used" });
  const thinking = h("input", { type: "checkbox", id: "think", onchange: () => frame({ type: "set_thinking",
    enabled: thinking.checked }) });
  const thinkLabel = h("label", { for: "think", class: "row", style: "margin:0;font-weight:400", hidden: true },
    thinking, "Thinking");
  const coding = h("input", { type: "checkbox", id: "coding-tools", onchange: () => frame({ type: "set_coding_tools",
    enabled: coding.checked }) });
  const codingLabel = h("label", { for: "coding-tools", class: "row", style: "margin:0;font-weight:400",
    title: "Offer the model read, bash, edit and write in the workspace folder; bash, edit and write ask first" },
  coding, "Coding tools");
  // This chat's always-allowed tools, each with a button that makes the chat ask again.
  const allowed = h("span", { class: "allowed small", hidden: true, role: "group", "aria-label": "Always allowed in this chat" });
  const adapter = h("select", { "aria-label": "Adapter", onchange: () => pickAdapter() },
    h("option", { value: "" }, "server default"), h("option", { value: "none" }, "base model"));
  // Router mode: which model answers this chat ("" is the server's default, sent as null).
  const model = h("select", { "aria-label": "Model for this chat", class: "model-pick", hidden: true,
    onchange: () => frame({ type: "set_model", model: model.value || null }) });
  const temp = h("input", { type: "number", step: "0.1", placeholder: "temp", style: "width:5.5em",
    "aria-label": "Temperature", onchange: () => setTemperature(), oninput: () => temp.setCustomValidity("") });
  samplingFields().then((fields) => {
    const field = fields.find((f) => f.name === "temperature");
    Object.assign(temp, { min: field.minimum, max: field.maximum, title: field.description });
  }).catch(() => {});  // the sampling panel says why
  const sampling = samplingPanel(frame, (values) => { temp.value = values.temperature ?? ""; });
  // A value outside the field's range (or not a number) is said at the field and not sent, so the box never
  // shows a temperature the chat does not have.
  function setTemperature() {
    const v = temp.validity;
    const problem = v.badInput ? "Temperature must be a number"
      : v.rangeUnderflow || v.rangeOverflow ? `Temperature must be between ${temp.min} and ${temp.max}` : "";
    temp.setCustomValidity(problem);
    temp.setAttribute("aria-invalid", String(Boolean(problem)));
    if (problem) { temp.reportValidity(); return; }
    frame({ type: "set_sampling", scope: "session", temperature: temp.value === "" ? null : Number(temp.value) });
  }
  const system = h("button", { type: "button", onclick: () => {
    const text = prompt("System prompt for this chat (empty clears it):", state.system || "");
    if (text === null) return;
    state.system = text; frame({ type: "set_system_prompt", text: text || null });
  } }, "System prompt");
  const sessionsToggle = h("button", { type: "button", class: "small sessions-toggle", onclick: () =>
    root.classList.toggle("show-sessions") }, "Chats");
  const images = imageAttacher(input);
  const queue = messageQueue(input, (behavior) => submit(behavior));
  const form = h("form", { onsubmit: (e) => { e.preventDefault(); submit(); } }, images.button, images.picker, input,
    stop, ...queue.buttons, send);
  const root = h("div", { class: "chat" },
    h("aside", { class: "sidebar", "aria-label": "Sessions" },
      h("button", { class: "primary", type: "button", style: "width:100%", onclick: () => { frame({ type: "new_session" }); root.classList.remove("show-sessions"); } },
        "New chat"), search, hits, sessionsList, importButton(frame)),
    h("section", { class: "convo" }, h("div", { class: "messages-wrap" }, messages, jump),
      h("div", { class: "composer" },
        h("div", { class: "chatbar" }, sessionsToggle, modelName, model, thinkLabel, codingLabel, allowed, adapter, temp,
          sampling.toggle, system, ctx), sampling.panel, images.strip, queue.chips, form)));
  speechInput({ form, input, before: stop, area: root });

  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(e.altKey ? "followUp" : "steer"); }
  });
  input.addEventListener("input", () => { input.style.height = "auto"; input.style.height = `${input.scrollHeight}px`; });
  let searchTimer;
  search.addEventListener("input", () => { clearTimeout(searchTimer); searchTimer = setTimeout(runSearch, 250); });
  // Mounted adapters, then the others on disk: one for the served model mounts when picked, one trained for
  // another base model shows greyed out (/v1/adapters/available says which). Read each time the chat shows (`shown`).
  function loadAdapters() {
    Promise.all([api("/v1/adapters"), api("/v1/adapters/available").catch(() => ({ adapters: [] }))]).then(([m, av]) => {
      const mounted = new Set(m.adapters.map((a) => a.id));
      // A fine-tune that ended before its last step left its last checkpoint: named so in the menu too.
      const partial = new Map(av.adapters.filter((a) => a.partial).map((a) => [a.id, a.partial]));
      const name = (id) => partial.has(id) ? `${id} · partial, step ${partial.get(id).step ?? "?"}` : id;
      adapter.replaceChildren(...[...adapter.options].slice(0, 2));  // server default, base model
      for (const a of m.adapters) adapter.append(h("option", { value: a.id }, name(a.id)));
      for (const a of av.adapters.filter((x) => !mounted.has(x.id))) {
        adapter.append(h("option", { value: a.id, disabled: !a.compatible, "data-path": a.path,
          title: a.compatible ? "mounted when picked" : `trained for ${a.base_model || "another model"}` },
        a.compatible ? `${name(a.id)} (mount)` : `${name(a.id)} (other base model)`));
      }
      adapter.value = state.adapter || "";
    }).catch(() => {});
  }

  async function pickAdapter() {
    const option = adapter.selectedOptions[0];
    if (option?.dataset.path) {
      try { await api("/v1/adapters", { json: { id: option.value, path: option.dataset.path } }); }
      catch (e) { toast(e.message); adapter.value = state.adapter || ""; return; }
      option.textContent = option.value; delete option.dataset.path;
    }
    state.adapter = adapter.value || null;
    frame({ type: "set_adapter", id: adapter.value || null });
  }

  function frame(obj) {
    if (state.ws?.readyState === WebSocket.OPEN) { state.ws.send(JSON.stringify(obj)); return true; }
    toast("Not connected yet");
    return false;
  }

  // While a turn streams the text goes to the server's queue: steering for this reply, or a follow-up after it.
  function submit(behavior = "steer") {
    const text = input.value.trim();
    if (!text) return;
    if (state.ws?.readyState !== WebSocket.OPEN) {  // nothing is sent: the text stays in the box
      toast("Not connected: the message stays here until the chat reconnects");
      return;
    }
    pinned = true;
    if (state.streaming) {
      if (frame({ type: "prompt", text, streamingBehavior: behavior })) { input.value = ""; input.style.height = "auto"; }
      return;
    }
    const pictures = images.take();
    state.items.push({ role: "user", content: text, siblingCount: 1, images: pictures });
    render();
    frame({ type: "prompt", text, images: pictures });
    input.value = ""; input.style.height = "auto";
  }

  function connect() {
    clearTimeout(state.timer);
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/chat`);
    state.ws = ws;
    ws.onmessage = (e) => onFrame(JSON.parse(e.data));
    ws.onopen = () => { state.retry = 0; };
    ws.onclose = (e) => {
      state.streaming = null; setBusy(false); queue.clear();  // a turn cut off by the drop is over
      modelName.hidden = false;
      if (e.code === 4403) { modelName.textContent = "refused: open the dashboard from the server's own address"; return; }
      if (e.code === 4401) { signIn(); return; }  // signed out, or the key changed
      modelName.textContent = "disconnected; reconnecting…";
      state.timer = setTimeout(connect, Math.min(500 * 2 ** state.retry++, 8000));
    };
  }

  function applySettings(s) {
    state.model = s?.model || null;  // a new chat (no settings yet) talks to the default
    pickModel();
    if (!s) return;
    thinking.checked = !!s.thinking;
    coding.checked = !!s.codingTools;
    adapter.value = s.adapter || ""; state.adapter = s.adapter || null;
    temp.value = s.sampling?.temperature ?? "";
    sampling.show(s.sampling || {});
    state.system = s.systemPrompt || "";
  }

  // The picker's options: the ids the ready frame offers (or /v1/models when it names none).
  async function fillModels(ready) {
    let ids = Array.isArray(ready.models) ? ready.models : [];
    if (!ids.length) {
      try { ids = (await api("/v1/models")).data.map((m) => m.id); } catch { ids = []; }
      if (state.ready !== ready) return;  // a newer ready frame filled it
    }
    model.replaceChildren(h("option", { value: "" }, `Default (${ready.model || "none"})`),
      ...ids.map((id) => h("option", { value: id }, id)));
    pickModel();
    if (!ready.model) setTimeout(() => awaitDefault(ready), 3000);
  }

  // A router with no default model yet (the demo model training towards its first checkpoint):
  // the picker names the default once there is one.
  async function awaitDefault(ready) {
    if (state.ready !== ready || !model.isConnected) return;
    try {
      const m = await api("/models");
      if (m.default && state.ready === ready) { adoptDefault(ready, m); return; }
    } catch { /* asked again below */ }
    setTimeout(() => awaitDefault(ready), 3000);
  }

  // The router's default may have changed since the ready frame (on the Models page, in another tab): each
  // time the chat is shown, the picker's "Default (…)" names the default as it is now.
  async function refreshDefault() {
    const ready = state.ready;
    if (!ready?.router) return;
    try {
      const m = await api("/models");
      if (state.ready === ready && m.default && m.default !== ready.model) adoptDefault(ready, m);
    } catch { /* the ready frame's name stays until the next ready frame */ }
  }

  // The router's default and models as `/models` (`m`) lists them, into the ready frame and the picker.
  function adoptDefault(ready, m) {
    ready.model = m.default;
    modelName.textContent = m.default;
    const ids = (m.data || []).map((d) => d.id);
    fillModels(ids.length ? { ...ready, models: ids } : ready);  // the ready frame itself, to refill from /v1/models
  }

  function pickModel() {
    const id = state.model || "";
    if (id && ![...model.options].some((o) => o.value === id)) {
      model.append(h("option", { value: id }, `${id} (not available)`));  // the session's pick, gone from the list
    }
    model.value = id;
  }

  function onFrame(f) {
    switch (f.type) {
      case "ready":
        state.ready = f; state.streaming = null; setBusy(false);
        modelName.textContent = f.model || "no model";
        sampling.defaults(f.genDefaults);
        modelName.hidden = !!f.router;
        model.hidden = !f.router;
        if (f.router) fillModels(f);
        thinkLabel.hidden = !f.thinking;
        coding.disabled = f.codingTools === false;
        codingLabel.title = coding.disabled ? "Coding tools run on the server's machine: open the dashboard there, or sign in"
          : "Offer the model read, bash, edit and write in the workspace folder; bash, edit and write ask first";
        if (state.active) frame({ type: "open_session", path: state.active });
        hooks.onReady?.(f);
        break;
      case "sessions": state.sessions = f.items; renderSessions(f.items, f.activePath); syncLive(); break;
      case "history":  // the first page; history_more frames bring the rest of a long chat
        if (f.sessionId !== state.active) { queue.clear(); pinned = true; }  // another chat opens at its end
        state.items = []; addItems(f.items); state.active = f.sessionId; remember(f.sessionId);
        state.streaming = null; setBusy(false);  // a turn still running there follows as frames from its first
        applySettings(f.settings);
        noteTurnModel();
        showAllowed(f.settings?.alwaysAllow || []); render(); break;
      case "history_more":
        if (f.sessionId !== state.active) break;
        addItems(f.items);
        if (f.more) scheduleRender(); else render();
        break;
      case "turn_start":
        state.active = f.sessionId; remember(f.sessionId);
        if (f.user) adoptUser(f.user);  // the question this reply answers
        state.streaming = { parts: [], thinking: "", el: null, calls: new Map() };
        state.live.add(f.sessionId); renderSessions(state.sessions);
        setBusy(true); render(); break;
      case "text_delta": if (state.streaming) { streamText(f.delta); paintStream(); } break;
      case "thinking_delta": if (state.streaming) { state.streaming.thinking += f.delta; paintStream(); } break;
      case "tool_start": if (state.streaming) streamTool(f); break;
      case "tool_approval_request": case "tool_approval_answered": case "tool_update": case "tool_end": {
        const card = state.streaming?.calls.get(f.callId);
        if (!card) break;
        if (f.type === "tool_approval_request") card.ask(f.args);
        else if (f.type === "tool_approval_answered") card.answered(f.decision);  // here, in another tab, or earlier
        else if (f.type === "tool_update") card.output(f.chunk);
        else card.end(f.ok, f.result);
        follow();
        break;
      }
      case "coding_tools":
        coding.checked = !!f.active;
        if (f.pending) toast(`Coding tools ${f.active ? "on" : "off"} from the next turn`);
        break;
      case "tool_approvals": if (!f.sessionId || f.sessionId === state.active) showAllowed(f.alwaysAllow); break;
      case "turn_end":
        if (f.continues) { endSegment(f); break; }
        state.streaming = null; setBusy(false);
        state.live.delete(f.sessionId);
        state.turnModel = f.model || null;  // which model answered (router mode), for the reply's label
        state.active = f.sessionId || state.active;
        if (state.active) frame({ type: "open_session", path: state.active });  // the stored turn, with ids
        break;
      case "context":
        ctx.textContent = f.contextWindow ? `${f.tokens} / ${f.contextWindow} tokens (${f.percent}%)` : `${f.tokens} tokens`;
        break;
      case "queue_update": queue.update(f); break;
      case "error": toast(f.message); if (!sampling.panel.hidden) sampling.error(f.message);
        if (!state.streaming) setBusy(false); break;
      default: hooks.onFrame?.(f); break;
    }
  }

  // A segment ends and a queued message goes on in the same turn: the stored reply joins the list (or, when
  // storing failed, the text streamed), the chat stays busy, and the next turn_start brings the user's message.
  function endSegment(f) {
    const s = state.streaming;
    const streamed = s ? s.parts.filter((p) => p.kind === "text").map((p) => p.text).join("") : "";
    if (f.entry) addItems([f.entry]);
    else if (streamed) state.items.push({ role: "assistant", content: streamed, siblingCount: 1 });
    state.streaming = null;
    render();
  }

  // The question a turn_start names, and the reply to come goes under it: whatever the list shows after it
  // goes (the reply a regenerate replaces). An edited question replaces the one it was edited from (it has the
  // same parent); this tab's own message gets its stored row; a queued one follows the answer stored before it.
  function adoptUser(row) {
    const shown = state.items.findLastIndex((it) => it.id === row.id);  // a long row comes in parts: keep them all
    if (shown >= 0) { state.items.length = shown + 1; return; }
    const last = state.items[state.items.length - 1];
    if (last?.role === "user" && !last.id && last.content === row.content) { Object.assign(last, row); return; }
    const parent = row.parentId ? state.items.findLastIndex((it) => it.id === row.parentId) : -1;
    if (parent >= 0 || row.parentId === null) state.items.length = parent + 1;
    state.items.push(row);
  }

  // The model named by the last turn_end labels the reply the history brings next, when the stored row lacks it.
  function noteTurnModel() {
    const last = state.items[state.items.length - 1];
    if (state.turnModel && last?.role === "assistant" && !last.meta?.model) {
      last.meta = { ...(last.meta || {}), model: state.turnModel };
    }
    state.turnModel = null;
  }

  // A row too large for one frame comes in parts: later parts have the same id and `continued`.
  function addItems(items) {
    for (const it of items) {
      const last = state.items[state.items.length - 1];
      if (!it.continued || !last || last.id !== it.id) { state.items.push(it); continue; }
      last.content = (last.content || "") + (it.content || "");
      last.reasoning = (last.reasoning || "") + (it.reasoning || "");
      if (it.meta?.toolRounds) {
        last.meta = { ...(last.meta || {}), toolRounds: [...(last.meta?.toolRounds || []), ...it.meta.toolRounds] };
      }
      const rounds = last.meta?.toolRounds;
      if (it.meta?.roundCalls && rounds?.length) {  // one more call of a round too large for one part
        rounds[rounds.length - 1] = { ...rounds[rounds.length - 1],
          calls: [...(rounds[rounds.length - 1].calls || []), ...it.meta.roundCalls] };
      }
    }
  }

  let renderQueued = false;
  function scheduleRender() {
    if (renderQueued) return;
    renderQueued = true;
    requestAnimationFrame(() => { renderQueued = false; render(); });
  }

  function showAllowed(names) {
    allowed.hidden = !names.length;
    allowed.replaceChildren(h("span", { class: "muted" }, "Always allowed:"), ...names.map((name) =>
      h("span", { class: "badge" }, name, h("button", { type: "button", class: "revoke", title: `Ask again before ${name} runs in this chat`,
        "aria-label": `Revoke always-allow for ${name}`, onclick: () => frame({ type: "revoke_approval", tool: name }) }, "×"))));
  }

  function setBusy(on) {
    send.hidden = on; stop.hidden = !on; input.disabled = false;
    queue.busy(on); form.classList.toggle("busy", on); hooks.onBusy?.(on);
  }

  function renderSessions(items, activePath) {
    if (activePath) { state.active = activePath; remember(activePath); }
    sessionsList.replaceChildren(...items.map((s) => h("li", { class: "session-row" }, h("button", {
      type: "button", class: s.path === state.active ? "active" : "", title: s.title,
      "aria-current": s.path === state.active ? "true" : null,
      onclick: () => { frame({ type: "open_session", path: s.path }); root.classList.remove("show-sessions"); },
    }, state.live.has(s.path) ? h("span", { class: "spinner", role: "status", "aria-label": "generating" }) : null,
    s.title), ...sessionMenu(s, frame))));
    // On a phone the list hides behind "Chats": the button says when a chat is generating.
    sessionsToggle.replaceChildren(state.live.size ? h("span", { class: "spinner", role: "status",
      "aria-label": "a chat is generating" }) : "", "Chats");
  }

  // Which of the listed chats have a turn running: asked by id (the server lists nobody's streams),
  // again every LIVE_POLL_MS while one runs, and when the page shows again.
  async function syncLive() {
    clearTimeout(state.liveTimer);
    const ids = state.sessions.map((s) => s.path);
    if (!ids.length) return;
    let found;
    try { found = (await api("/v1/streams/lookup", { json: { conversation_ids: ids } })).data; } catch { return; }
    const live = new Set(found.filter((r) => r.status === "live").map((r) => r.conversation_id));
    const changed = live.size !== state.live.size || [...live].some((id) => !state.live.has(id));
    state.live = live;
    if (changed) renderSessions(state.sessions);
    if (live.size && !document.hidden) state.liveTimer = setTimeout(syncLive, LIVE_POLL_MS);
  }

  // A tab that shows again: reconnect at once if the socket dropped while it was hidden
  // (the open chat's running turn comes back from its first frame), and refresh the spinners.
  function onVisible() {
    if (document.hidden) return;
    if (!state.ws || state.ws.readyState === WebSocket.CLOSED) { state.retry = 0; connect(); }
    syncLive();
  }
  document.addEventListener("visibilitychange", onVisible);

  async function runSearch() {
    const q = search.value.trim();
    if (!q) { hits.replaceChildren(); return; }
    try {
      const r = await api(`/api/sessions/search?q=${encodeURIComponent(q)}`);
      hits.replaceChildren(...r.results.flatMap((res) => res.matches.slice(0, 3).map((m) => {
        const [a, b] = m.ranges[0];
        return h("button", { type: "button", onclick: () => {
          frame({ type: "open_session", path: res.session_path }); root.classList.remove("show-sessions");
        } },
          h("div", { class: "small" }, h("strong", {}, res.session_title)),
          h("span", { class: "muted" }, m.snippet.slice(0, a)), h("mark", {}, m.snippet.slice(a, b)),
          h("span", { class: "muted" }, m.snippet.slice(b)));
      })));
      if (!r.results.length) hits.replaceChildren(h("p", { class: "muted small" }, "No matches"));
    } catch (e) { toast(e.message); }
  }

  function siblingNav(item) {
    if (!item.siblingCount || item.siblingCount < 2 || !item.siblingIds) return null;
    const go = (d) => frame({ type: "switch_sibling", entryId: item.siblingIds[item.siblingIndex + d] });
    return h("span", { class: "row small" },
      h("button", { type: "button", "aria-label": "Previous version", disabled: item.siblingIndex === 0,
        onclick: () => go(-1) }, "‹"),
      `${item.siblingIndex + 1}/${item.siblingCount}`,
      h("button", { type: "button", "aria-label": "Next version", disabled: item.siblingIndex >= item.siblingCount - 1,
        onclick: () => go(1) }, "›"));
  }

  function message(item, isLast) {
    const body = item.role === "user" ? h("div", { class: "body" }, turnImages(item), item.content) : h("div", { class: "body" },
      item.reasoning ? h("details", { class: "thinking" }, h("summary", {}, "Thinking"), markdown(item.reasoning)) : null,
      ...answerParts(item),
      item.meta?.error ? h("p", { class: "error", role: "alert" }, `${item.content ? "The reply broke off" : "Not answered"}: ${item.meta.error}`) : null,
      lengthNote(item.meta));
    const tools = h("div", { class: "tools" });
    if (item.role === "assistant") {
      if (item.content) {
        tools.append(h("button", { type: "button", onclick: () => navigator.clipboard?.writeText(item.content)
          .then(() => toast("Copied")) }, "Copy"));
      }
      if (isLast) tools.append(h("button", { type: "button", onclick: () => { pinned = true; frame({ type: "regenerate" }); } },
        "Regenerate"));
    } else if (item.id) {
      tools.append(h("button", { type: "button", onclick: () => editInPlace(item, body) }, "Edit"));
    }
    return h("article", { class: `msg ${item.role}` },
      h("div", { class: "who" }, item.role === "user" ? "You" : answeredBy(item), siblingNav(item),
        perfStrip(item.meta), cutNote(item.meta)), body, tools);
  }

  // Where the model's view of this chat begins: the newest reply sent without the oldest turns (chat/window.py)
  // names the first message it saw; the line goes above that message.
  function contextCut() {
    const reply = state.items.findLast((it) => it.role === "assistant" && it.meta?.prompt_tokens !== undefined);
    const cut = reply?.meta?.context_cut;
    if (!cut) return null;
    const at = state.items.findIndex((it) => it.id === cut.first_seen);
    return at > 0 ? { at, hidden: cut.hidden } : null;
  }

  function cutMarker(hidden) {
    const n = hidden === 1 ? "the message above" : `the ${hidden} messages above`;
    return h("div", { class: "context-cut muted small", role: "note" },
      `The model no longer sees ${n}: this chat outgrew its context, so each turn sends the newest messages that `
      + "fit. They stay saved here.");
  }

  // A turn sent without its oldest messages says so in its meta line.
  function cutNote(meta) {
    const cut = meta?.context_cut;
    if (!cut) return null;
    return h("span", { class: "cut-note", title: "The oldest messages did not fit the model's context" },
      ` · sent without the oldest ${cut.hidden} messages`);
  }

  // A reply that ended at its length, not where the model stopped, says so (and why, when the chat's cap did it).
  function lengthNote(meta) {
    if (meta?.finish_reason !== "length" || meta.aborted) return null;
    const budget = meta.reply_budget;
    const text = budget
      // context_window is the model's window or the operator's cap (--max-context, the memory budget), the smaller.
      ? `Stopped at the chat's reply limit: ${budget.max_tokens} tokens, a quarter of the `
        + `${budget.context_window}-token context this server allows, so the conversation has room to go on. `
        + "Set max_tokens under Sampling… for longer replies."
      : "Stopped at its length limit (max_tokens under Sampling…, or the end of the model's context).";
    return h("p", { class: "muted small length-note" }, text);
  }

  // Who wrote a reply: the model its turn names (router mode stores it), else the one model served.
  function answeredBy(item) {
    return item.meta?.model || (!state.ready?.router && state.ready?.model) || "Model";
  }

  // An answer with tool rounds: each round's text, its calls as cards, then the rest of the text.
  function answerParts(item) {
    const rounds = item.meta?.toolRounds || [];
    const out = [];
    let used = 0;
    for (const r of rounds) {
      if (r.text) out.push(markdown(r.text));
      used += (r.text || "").length;
      for (const c of r.calls || []) {
        const card = toolCard({ callId: c.id, tool: c.tool, args: c.args }, frame);
        card.end(c.ok, c.result);
        out.push(card.el);
      }
    }
    const rest = item.content.slice(used);
    if (rest || !rounds.length) out.push(markdown(rest));
    return out;
  }

  function streamText(delta) {
    const s = state.streaming;
    let last = s.parts[s.parts.length - 1];
    if (!last || last.kind !== "text") {
      last = { kind: "text", text: "", el: h("div", { class: "part" }) };
      s.parts.push(last);
      s.el?.querySelector(".body").append(last.el);
    }
    last.text += delta; last.dirty = true;
  }

  function streamTool(f) {
    const s = state.streaming;
    const card = toolCard(f, frame, true);
    s.calls.set(f.callId, card);
    s.parts.push({ kind: "tool", el: card.el });
    s.el?.querySelector(".body").append(card.el);
    follow();
  }

  function editInPlace(item, body) {
    const area = h("textarea", { rows: 3, style: "width:100%", "aria-label": "Edit message" });
    area.value = item.content;
    body.replaceChildren(area, h("div", { class: "row" },
      h("button", { class: "primary", type: "button", onclick: () => {
        if (area.value.trim()) { pinned = true; frame({ type: "edit_resend", text: area.value, entryId: item.id }); }
      } }, "Send edit"), h("button", { type: "button", onclick: render }, "Cancel")));
    area.focus();
  }

  function render() {
    const top = messages.scrollTop;
    const last = state.items.length - 1;
    const cut = contextCut();
    messages.replaceChildren(...state.items.flatMap((item, i) => {
      const shown = message(item, i === last && !state.streaming);
      return cut && i === cut.at ? [cutMarker(cut.hidden), shown] : [shown];
    }));
    if (!state.items.length && !state.streaming) {
      messages.append(h("div", { class: "msg muted" }, h("h1", {}, "Start a conversation"),
        h("p", {}, "Replies stream as they are written; sessions are kept, and searchable in the list of chats.")));
    }
    if (state.streaming) {
      const s = state.streaming;
      s.thinkingEl = h("details", { class: "thinking", open: true, hidden: true }, h("summary", {}, "Thinking"),
        h("div", {}));
      s.el = h("article", { class: "msg assistant" }, h("div", { class: "who" }, "Model · writing…"),
        h("div", { class: "body" }, s.thinkingEl, ...s.parts.map((p) => p.el)));
      for (const p of s.parts) p.dirty = p.kind === "text";
      messages.append(s.el);
      paintStream();
    }
    if (!pinned) messages.scrollTop = top;  // drawn again under a reader who scrolled up: the view stays put
    follow();
  }

  let painting = false;
  function paintStream() {
    if (painting) return;
    painting = true;
    requestAnimationFrame(() => {
      painting = false;
      const s = state.streaming;
      if (!s?.el) return;
      if (s.thinking) {
        s.thinkingEl.hidden = false;
        s.thinkingEl.lastChild.replaceChildren(markdown(s.thinking));
      }
      for (const p of s.parts) {
        if (p.kind === "text" && p.dirty) { p.el.replaceChildren(markdown(p.text)); p.dirty = false; }
      }
      follow();
    });
  }

  connect();
  render();
  return {
    root, input,
    // A frame the user did not ask for (the app context): sent when the socket is open, else dropped.
    send(obj) { if (state.ws?.readyState === WebSocket.OPEN) state.ws.send(JSON.stringify(obj)); },
    // The chat shows (its page, or the dock opened): the adapters on disk may have changed since it last did.
    shown() { loadAdapters(); refreshDefault(); },
    // The conversation's scroll is lost when the chat moves between the page and the dock.
    moved() { pinned = true; follow(); },
  };
}
