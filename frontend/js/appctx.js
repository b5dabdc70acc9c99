// The app-aware assistant's side of the page. The chat socket gets a `context` frame after each ready frame,
// each route change (main.js fires `hearth:route`) and each wizard step change (wizards.js fires `hearth:step`),
// never on a timer: the route, the wizard step and a snapshot of the page's visible interactive elements, each
// with a `data-ref` that stays on the element so a later `ref` finds it again. The server's `ui_navigate` and
// `ui_spotlight` frames come to `handleUiFrame`: go to a page; find an element (ref, then CSS selector, then a
// fuzzy label match, then a catalog id from `data-spot`), set its value when asked, and show a brief highlight
// that takes no focus; each answers what it did and the route it left the page on (dock.js sends that back as
// `ui_result`). Wizard fields live across steps: `registerSpot` keeps them findable on a step not shown.
import { h, toast } from "./util.js";

export const ROUTES = ["chat", "status", "models", "memory", "jobs", "finetune", "quantize", "dataset", "adapters", "settings"];
const MAX_ELEMENTS = 120;
const SETTLE_MS = 250;  // a page renders what it fetched; one frame for a route and its first wizard step
const INTERACTIVE = "input:not([type=hidden]), select, textarea, button, a[href], [role=button], [role=link], [role=tab]";

const spots = new Map();  // catalog id -> { el, step, stepLabel, label, wizard: { root, rail } }
const wiring = { send: null, openDock: () => {}, closeDockIfCovering: () => {} };
let lastStep = null;  // { index, count, label, rail }
let refs = 0;
let pushTimer = null;

export function currentRoute() {
  const [name, ...rest] = location.hash.replace(/^#\/?/, "").split("/");
  return { route: ROUTES.includes(name) ? name : "chat", view: rest.filter(Boolean).join("/") || undefined };
}

// The chat's socket and the dock's controls; the context goes out after every ready frame (`push`).
export function startAppContext({ send, openDock, closeDockIfCovering }) {
  Object.assign(wiring, { send, openDock, closeDockIfCovering });
  addEventListener("hearth:route", schedulePush);
  addEventListener("hearth:step", (e) => { lastStep = e.detail; schedulePush(); });
  return { push: schedulePush };
}

function schedulePush() {
  clearTimeout(pushTimer);
  pushTimer = setTimeout(() => wiring.send?.({ type: "context", context: appContext() }), SETTLE_MS);
}

export function appContext() {
  const { route, view } = currentRoute();
  const context = { route };
  if (view) context.view = view;
  if (lastStep?.rail?.isConnected) {
    context.step = { index: lastStep.index, count: lastStep.count, label: lastStep.label };
  }
  context.snapshot = snapshot(route);
  return context;
}

// Visible interactive elements of the page (the chat counts only on #/chat; the dock lives outside #main).
export function snapshot(route = currentRoute().route) {
  const main = document.getElementById("main");
  const elements = [];
  for (const el of main.querySelectorAll(INTERACTIVE)) {
    if (elements.length >= MAX_ELEMENTS) break;
    if (!shown(el) || (route !== "chat" && el.closest(".dock"))) continue;
    el.dataset.ref ||= `e${++refs}`;
    const item = { ref: el.dataset.ref, label: labelOf(el), kind: kindOf(el) };
    const role = roleOf(el);
    if (role) item.role = role;
    item.selector = selectorOf(el);
    if (el.dataset.spot) item.spotlightId = el.dataset.spot;
    elements.push(item);
  }
  return { route, capturedAt: new Date().toISOString(), elements };
}

function shown(el) {
  return el.getClientRects().length > 0 && getComputedStyle(el).visibility !== "hidden";
}

function kindOf(el) {
  const tag = el.tagName.toLowerCase();
  if (tag === "a" || el.getAttribute("role") === "link") return "link";
  if (tag === "input" || tag === "select" || tag === "textarea") return tag;
  return "button";
}

const INPUT_ROLES = { checkbox: "checkbox", radio: "radio", range: "slider", search: "searchbox", number: "spinbutton" };
function roleOf(el) {
  return el.getAttribute("role") || (el.tagName === "INPUT" ? INPUT_ROLES[el.type] : undefined);
}

const squash = (s) => (s || "").replace(/\s+/g, " ").trim();

export function labelOf(el) {
  const byFor = el.id ? document.querySelector(`label[for="${CSS.escape(el.id)}"]`) : null;
  const wrap = el.closest("label");
  const own = (label) => label && squash([...label.childNodes].filter((n) => n !== el
    && !(n.nodeType === 1 && n.matches("input, select, textarea"))).map((n) => n.textContent).join(" "));
  const text = own(byFor) || squash(el.getAttribute("aria-label")) || own(wrap) || squash(el.getAttribute("placeholder"))
    || (el.matches("select, textarea, input") ? "" : squash(el.innerText)) || squash(el.title) || el.name || "";
  return text.length > 80 ? `${text.slice(0, 79)}…` : text;
}

function selectorOf(el) {
  if (el.dataset.spot) return `[data-spot="${el.dataset.spot}"]`;
  if (el.id) return `#${CSS.escape(el.id)}`;
  const aria = el.getAttribute("aria-label");
  if (aria) {
    const sel = `${el.tagName.toLowerCase()}[aria-label="${aria.replace(/["\\]/g, "\\$&")}"]`;
    if (document.querySelectorAll(sel).length === 1) return sel;
  }
  return `[data-ref="${el.dataset.ref}"]`;
}

// A catalog id on an element; a wizard field also names its step, so it is found while another step shows.
export function registerSpot(id, el, info = {}) {
  el.dataset.spot = id;
  spots.set(id, { el, ...info });
}

// -- frames from the server ---------------------------------------------------------------------------

export async function handleUiFrame(f) {
  if (f.type === "ui_navigate") return navigate(f.route);
  if (f.type === "ui_spotlight") return spotlight(f);
  return null;
}

async function navigate(route) {
  if (!ROUTES.includes(route)) { toast(`The assistant named an unknown page: ${route}`); return { ok: false }; }
  if (route !== "chat") wiring.openDock();  // the conversation stays in view beside the page
  if (currentRoute().route === route && location.hash.startsWith(`#/${route}`)) return { ok: true, route };
  const arrived = new Promise((resolve) => {
    const done = () => { removeEventListener("hearth:route", done); clearTimeout(give); resolve(); };
    const give = setTimeout(done, 2000);
    addEventListener("hearth:route", done);
  });
  location.hash = `#/${route}`;
  await arrived;
  return { ok: true, route };
}

async function spotlight(f) {
  if (f.route && f.route !== currentRoute().route) {
    const went = await navigate(f.route);
    if (!went.ok) return { ...went, route: currentRoute().route };
    await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  }
  const found = resolve(f);
  const name = f.target || f.label || f.selector || f.ref || "that";
  const route = currentRoute().route;
  if (!found) { toast(`Could not find “${name}” on this page`); return { ok: false, found: null, route }; }
  const { el, entry } = found;
  const label = entry?.label || labelOf(el) || name;
  const shownValue = f.value !== undefined && f.value !== null ? setValue(el, f.value) : null;
  if (!el.isConnected && entry?.wizard) {  // a field on another step of the wizard
    const item = entry.wizard.rail.children[entry.step];
    const where = `step ${entry.step + 1}, ${entry.stepLabel}`;
    toast(shownValue !== null ? `${label} set to ${shownValue} (${where})` : `${label} is on ${where}`);
    if (item) ring(item, f.message);
    return { ok: true, found: "step", route, step: entry.step, stepLabel: entry.stepLabel, value: shownValue };
  }
  if (el.closest(".dock")) wiring.openDock();  // the message box, on a page other than #/chat
  else wiring.closeDockIfCovering();
  ring(el, f.message);
  if (shownValue !== null && !f.message) toast(`${label} set to ${shownValue}`);
  return { ok: true, found: "page", route, ref: el.dataset.ref, value: shownValue };
}

function resolve(f) {
  if (f.ref) {
    const el = document.querySelector(`[data-ref="${CSS.escape(String(f.ref))}"]`);
    if (el) return { el };
  }
  if (f.selector) {
    let el = null;
    try { el = document.querySelector(f.selector); } catch { el = null; }
    if (el) return { el };
  }
  if (f.label) {
    const el = byLabel(f.label);
    if (el) return { el };
  }
  for (const key of [f.target, f.ref, f.label, f.selector]) {
    const hit = typeof key === "string" && bySpot(key);
    if (hit) return hit;
  }
  return null;
}

function bySpot(id) {
  const entry = spots.get(id);
  if (entry && (entry.el.isConnected || entry.wizard?.root.isConnected)) return { el: entry.el, entry };
  let el = null;
  try { el = document.querySelector(`[data-spot="${CSS.escape(id)}"]`); } catch { el = null; }
  return el ? { el, entry: entry?.el === el ? entry : undefined } : null;
}

const words = (s) => squash(s).toLowerCase().replace(/[^\p{L}\p{N}]+/gu, " ").trim();

// The visible element whose label reads most like the words asked for.
function byLabel(wanted) {
  const want = words(wanted);
  if (!want) return null;
  const wantSet = new Set(want.split(" "));
  let best = null, bestScore = 0;
  const route = currentRoute().route;
  for (const el of document.getElementById("main").querySelectorAll(INTERACTIVE)) {
    if (!shown(el) || (route !== "chat" && el.closest(".dock"))) continue;
    const have = words(labelOf(el));
    if (!have) continue;
    let score;
    if (have === want) score = 3;
    else if (have.startsWith(want) || want.startsWith(have)) score = 2;
    else if (have.includes(want) || want.includes(have)) score = 1.5;
    else {
      const shared = have.split(" ").filter((w) => wantSet.has(w)).length;
      score = shared / Math.max(wantSet.size, have.split(" ").length);
    }
    if (score > bestScore) { best = el; bestScore = score; }
  }
  return bestScore >= 0.5 ? best : null;
}

// Sets an input's, a textarea's or a select's value as typing would (input and change events); answers the
// value as shown (a select's option text), or null when the element takes no value.
// Only the catalog's fields (data-spot) are filled, never a checkbox or radio: the model must not reach
// the chat's own controls (coding tools, model, adapter) or any switch through a selector or label.
function setValue(el, value) {
  if (!el.matches("input, select, textarea") || !el.dataset.spot || el.type === "checkbox" || el.type === "radio") {
    return null;
  }
  const want = String(value);
  if (el.tagName === "SELECT") {
    const options = [...el.options];
    const norm = (s) => squash(s).toLowerCase();
    const option = options.find((o) => o.value === want) || options.find((o) => norm(o.textContent) === norm(want))
      || options.find((o) => norm(o.textContent).startsWith(norm(want)));
    if (!option) return null;
    el.value = option.value;
  } else {
    el.value = want;
  }
  el.dispatchEvent(new Event("input", { bubbles: true }));
  el.dispatchEvent(new Event("change", { bubbles: true }));
  return el.tagName === "SELECT" ? squash(el.selectedOptions[0]?.textContent) : want;
}

let bubble = null;
function ring(el, message) {
  const still = matchMedia("(prefers-reduced-motion: reduce)").matches;
  el.scrollIntoView({ block: "center", inline: "nearest", behavior: still ? "auto" : "smooth" });
  el.classList.remove("spotlit");
  void el.offsetWidth;  // restart the animation on an element lit a moment ago
  el.classList.add("spotlit");
  setTimeout(() => el.classList.remove("spotlit"), 2600);
  bubble?.remove();
  bubble = null;
  if (!message) return;
  const note = h("div", { class: "spot-bubble", role: "status" }, message);
  bubble = note;
  document.body.append(note);
  const place = () => {
    const r = el.getBoundingClientRect();
    const width = note.offsetWidth;
    note.style.left = `${Math.max(8, Math.min(r.left, innerWidth - width - 8))}px`;
    note.style.top = `${Math.min(r.bottom + 8, innerHeight - note.offsetHeight - 8)}px`;
  };
  place();
  setTimeout(place, still ? 0 : 450);  // after the smooth scroll
  setTimeout(() => { note.remove(); if (bubble === note) bubble = null; }, 4000);
}
