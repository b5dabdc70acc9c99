// Small DOM and HTTP helpers shared by every page.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined && c !== false) el.append(c.nodeType ? c : String(c));
  return el;
}

export async function api(path, options = {}) {
  const init = { ...options, headers: { ...(options.headers || {}) } };
  if (options.json !== undefined) {
    init.method = init.method || "POST";
    init.body = JSON.stringify(options.json);
    init.headers["content-type"] = "application/json";
  }
  const r = await fetch(path, init);
  if (r.status === 401) signIn();
  let body = null;
  try { body = await r.json(); } catch { body = null; }
  if (!r.ok || (body && body.ok === false)) {
    const msg = body?.error?.message || body?.error || `${r.status} ${r.statusText}`;
    const err = new Error(typeof msg === "string" ? msg : JSON.stringify(msg));
    err.status = r.status; err.body = body;
    throw err;
  }
  return body;
}

// The server wants its key (signed out, or the key was changed): off to the sign-in page, back here after.
export function signIn() {
  location.assign(`/signin?next=${encodeURIComponent(location.pathname + location.hash)}`);
}

let toastTimer;
export function toast(text) {
  const el = document.getElementById("toast");
  el.textContent = text; el.classList.add("show");
  clearTimeout(toastTimer); toastTimer = setTimeout(() => el.classList.remove("show"), 3500);
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"]; let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function bar(fraction, label) {
  const pct = Math.max(0, Math.min(1, fraction || 0)) * 100;
  return h("div", { class: "bar", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": 100,
    "aria-valuenow": Math.round(pct), "aria-label": label || "progress" }, h("span", { style: `width:${pct}%` }));
}

export function fitBadge(a) {
  if (!a) return h("span", { class: "badge" }, "unknown");
  if (!a.fits) return h("span", { class: "badge bad" }, "does not fit");
  return h("span", { class: "badge ok", title: `max context ${a.max_safe_context}` },
    `fits · ~${a.predicted_decode_tps} tok/s`);
}

// Poll while the page is showing; returns a stop function.
export function every(ms, fn) {
  let stopped = false;
  const tick = async () => { if (stopped) return; try { await fn(); } catch (e) { /* shown by fn */ }
    if (!stopped) setTimeout(tick, ms); };
  tick();
  return () => { stopped = true; };
}

// An SVG element with its attributes (and text); the pages that draw (lineage, the Curve Designer and Terrain) use it.
export function svg(tag, attrs = {}, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// The ◐ button of a page outside the dashboard's shell (the Curve Designer and Terrain): the saved theme, and the switch.
export function themeButton() {
  const saved = localStorage.getItem("hearth-theme");
  if (saved) document.documentElement.dataset.theme = saved;
  document.querySelector(".theme").addEventListener("click", () => {
    const t = document.documentElement.dataset.theme;
    const dark = t ? t === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
    document.documentElement.dataset.theme = dark ? "light" : "dark";
    localStorage.setItem("hearth-theme", document.documentElement.dataset.theme);
  });
}
