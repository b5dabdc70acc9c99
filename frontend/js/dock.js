// The chat dock. One chat (one socket) lives for the whole app: on #/chat it fills the page; on every other
// page the same DOM moves into a side panel opened by the "Assistant" button (full screen on a phone), so a
// running turn goes on streaming while the user moves around. The button sits in the sticky header, so it is
// always in reach and never lies over a page's controls. The panel hides the sessions list and the chat bar
// behind "Options"; open or closed is remembered; Escape closes it.
import { createChat } from "./chat.js";
import { handleUiFrame, startAppContext } from "./appctx.js";
import { h } from "./util.js";

const OPEN_KEY = "hearth.dock.open";
const PHONE = "(max-width: 760px)";

function storedOpen() {
  try { return localStorage.getItem(OPEN_KEY) === "1"; } catch { return false; }
}

function storeOpen(on) {
  try { localStorage.setItem(OPEN_KEY, on ? "1" : "0"); } catch { /* private mode */ }
}

export function mountDock() {
  let docked = false;
  let context = null;
  // A ui frame with a callId waits on the server for what came of it: the answer goes back as `ui_result`.
  const chat = createChat({ onReady: () => context?.push(), onBusy: busy, onFrame: async (f) => {
    const done = await handleUiFrame(f);
    if (done && f.callId) chat.send({ type: "ui_result", callId: f.callId, result: done });
  } });
  const options = h("button", { type: "button", class: "small", "aria-expanded": "false", "aria-controls": "dock-body",
    title: "Chats, model, sampling and the other chat settings", onclick: () => {
      const on = chat.root.classList.toggle("show-bar");
      options.setAttribute("aria-expanded", String(on));
      if (!on) chat.root.classList.remove("show-sessions");
    } }, "Options");
  const close = h("button", { type: "button", class: "small dock-close", "aria-label": "Close the assistant",
    onclick: () => setOpen(false, true) }, "×");
  const body = h("div", { class: "dock-body", id: "dock-body" });
  const panel = h("aside", { class: "dock", id: "dock", "aria-label": "Assistant", hidden: true },
    h("div", { class: "dock-head" }, h("strong", {}, "Assistant"), options,
      h("a", { href: "#/chat", class: "small", title: "Open the chat as a page" }, "Full page"), close),
    body);
  const toggle = h("button", { type: "button", class: "dock-toggle primary", "aria-controls": "dock", "aria-expanded": "false",
    hidden: true, onclick: () => setOpen(true, true) }, "Assistant");
  document.querySelector(".top .theme").before(toggle);
  document.body.append(panel);
  // Escape closes it from inside, or when nothing has the focus (a button that hid itself, e.g. Stop).
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape" || e.defaultPrevented || panel.hidden) return;
    const at = document.activeElement;
    if (panel.contains(at) || !at || at === document.body) { e.preventDefault(); setOpen(false, true); }
  });
  addEventListener("resize", fitUnderHeader);

  // While a reply is written the button says so (the dock may be closed).
  function busy(on) {
    toggle.replaceChildren(on ? h("span", { class: "spinner", role: "status", "aria-label": "writing" }) : "", "Assistant");
  }

  // The panel starts under the sticky header on a wide screen (a phone gets the whole screen).
  function fitUnderHeader() {
    panel.style.setProperty("--dock-top", `${document.querySelector(".top")?.getBoundingClientRect().bottom ?? 0}px`);
  }

  function setOpen(on, moveFocus = false) {
    storeOpen(on);
    if (!docked) return;
    const typing = chat.root.contains(document.activeElement);
    panel.hidden = !on;
    toggle.hidden = on;
    toggle.setAttribute("aria-expanded", String(on));
    document.body.classList.toggle("dock-open", on);
    if (on) { fitUnderHeader(); chat.moved(); chat.shown(); }
    if (moveFocus && on) chat.input.focus();
    else if (!on && (moveFocus || typing)) toggle.focus();
  }

  // Where the chat shows for a route: the page itself on #/chat (`main` is emptied for it), else the dock.
  function place(route, main) {
    const typing = chat.root.contains(document.activeElement);
    if (route === "chat") {
      docked = false;
      chat.root.classList.remove("docked", "show-bar");
      main.replaceChildren(chat.root);
      panel.hidden = true; toggle.hidden = true;
      document.body.classList.remove("has-dock", "dock-open");
      chat.moved();
      chat.shown();
      chat.input.focus({ preventScroll: true });
      return;
    }
    const entering = !docked;
    docked = true;
    if (chat.root.parentNode !== body) {
      chat.root.classList.add("docked");
      body.append(chat.root);
    }
    document.body.classList.add("has-dock");
    if (entering) setOpen(storedOpen());
    if (typing && !panel.hidden) chat.input.focus({ preventScroll: true });  // still typing in the dock
  }

  context = startAppContext({
    send: chat.send,
    openDock: () => setOpen(true),
    // On a phone the open dock covers the page: it steps aside for a highlight there, unless the user is typing.
    closeDockIfCovering: () => {
      if (docked && !panel.hidden && matchMedia(PHONE).matches && !chat.root.contains(document.activeElement)) setOpen(false);
    },
  });
  return { place, open: () => setOpen(true) };
}
