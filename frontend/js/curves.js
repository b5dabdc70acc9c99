// The Curve Designer (/curves): draw a monotone transfer curve over next-token log-probabilities, see the
// model's distribution under it (POST /signal), and compare samples drawn with it against the model's
// default recipe (POST /generate). Works opened from another origin too: the server and key are settable.
import { h, svg as el, themeButton } from "./util.js";

const X0 = -20, X1 = 0, BINS = 80;
const W = 640, H = 400, M = { left: 46, right: 14, top: 14, bottom: 38 };
const PW = W - M.left - M.right, PH = H - M.top - M.bottom;
const PRESETS = {
  identity: [[-20, -20], [0, 0]],
  flatten: [[-20, -20], [-6, -6], [-2, -1], [0, 0]],
  cut: [[-20, -20], [-8, -20], [-6, -6], [0, 0]],
  hot: [[-20, -10], [0, 0]],
  cool: [[-20, -20], [-10, -20], [0, 0]],
};

const $ = (id) => document.getElementById(id);
const px = (x) => M.left + ((x - X0) / (X1 - X0)) * PW;
const py = (y) => M.top + (1 - (y - X0) / (X1 - X0)) * PH;
const clamp = (v, lo, hi) => Math.min(hi, Math.max(lo, v));
const round = (v) => Math.round(v * 100) / 100;

let points = PRESETS.identity.map((p) => [...p]);
let bins = null;
let vocab = 0;
let selected = -1;

function draw() {
  const svg = $("plot");
  svg.replaceChildren();
  const grid = el("g", { class: "grid-lines" });
  for (let v = X0; v <= X1; v += 5) {
    grid.append(el("line", { x1: px(v), x2: px(v), y1: M.top, y2: M.top + PH }));
    grid.append(el("line", { x1: M.left, x2: M.left + PW, y1: py(v), y2: py(v) }));
    const tx = el("text", { x: px(v), y: H - 20, "text-anchor": "middle" }); tx.textContent = v; grid.append(tx);
    const ty = el("text", { x: M.left - 8, y: py(v) + 4, "text-anchor": "end" }); ty.textContent = v; grid.append(ty);
  }
  const xl = el("text", { x: M.left + PW / 2, y: H - 4, "text-anchor": "middle", class: "axis" });
  xl.textContent = "log-probability of a token";
  const yl = el("text", { x: 12, y: M.top + PH / 2, "text-anchor": "middle", class: "axis",
    transform: `rotate(-90 12 ${M.top + PH / 2})` });
  yl.textContent = "log-weight drawn with";
  svg.append(grid, xl, yl);
  if (bins) {  // the signal: counts on a log scale, under the curve
    const most = Math.log1p(Math.max(...bins));
    const g = el("g", { class: "signal" });
    const bw = PW / BINS;
    bins.forEach((c, i) => {
      if (!c) return;
      const bh = (Math.log1p(c) / most) * PH * 0.45;
      const r = el("rect", { x: M.left + i * bw + 0.5, y: M.top + PH - bh, width: Math.max(bw - 1, 1), height: bh });
      const t = el("title"); t.textContent = `${c} tokens at ${(X0 + i * 0.25).toFixed(2)}…${(X0 + (i + 1) * 0.25).toFixed(2)}`;
      r.append(t); g.append(r);
    });
    svg.append(g);
  }
  svg.append(el("line", { x1: px(X0), y1: py(X0), x2: px(X1), y2: py(X1), class: "diagonal" }));
  svg.append(el("polyline", { class: "curve-line", points: points.map(([x, y]) => `${px(x)},${py(y)}`).join(" ") }));
  points.forEach(([x, y], i) => {
    const c = el("circle", { cx: px(x), cy: py(y), r: 7, class: `handle${i === selected ? " selected" : ""}`,
      tabindex: 0, role: "slider", "aria-label": `point ${i + 1}: log-probability ${round(x)}, log-weight ${round(y)}`,
      "aria-valuenow": round(y), "aria-valuemin": X0, "aria-valuemax": X1 });
    c.dataset.index = i;
    svg.append(c);
  });
  $("readout").textContent = selected >= 0 ? `point ${selected + 1}: ${round(points[selected][0])} → ${round(points[selected][1])}` :
    `${points.length} points`;
}

function toData(evt) {
  const svg = $("plot");
  const box = svg.getBoundingClientRect();
  const sx = ((evt.clientX - box.left) / box.width) * W, sy = ((evt.clientY - box.top) / box.height) * H;
  return [clamp(X0 + ((sx - M.left) / PW) * (X1 - X0), X0, X1), clamp(X0 + (1 - (sy - M.top) / PH) * (X1 - X0), X0, X1)];
}

// Moving point i keeps the curve monotone: x stays between its neighbours (the ends keep theirs), y between their ys.
function move(i, x, y) {
  const last = points.length - 1;
  const lo = i === 0 ? X0 : points[i - 1][0] + 0.05, hi = i === last ? X1 : points[i + 1][0] - 0.05;
  const nx = i === 0 || i === last ? points[i][0] : clamp(x, lo, hi);
  const ylo = i === 0 ? X0 : points[i - 1][1], yhi = i === last ? X1 : points[i + 1][1];
  points[i] = [round(nx), round(clamp(y, ylo, yhi))];
}

function remove(i) {
  if (i <= 0 || i >= points.length - 1) return;  // the two ends stay
  points.splice(i, 1); selected = -1; draw();
}

function wirePlot() {
  const svg = $("plot");
  let dragging = -1;
  svg.addEventListener("pointerdown", (e) => {
    const i = e.target.dataset?.index;
    if (i !== undefined) {
      dragging = selected = Number(i); svg.setPointerCapture(e.pointerId); draw(); e.preventDefault(); return;
    }
    const [x, y] = toData(e);
    const at = points.findIndex(([px0]) => px0 > x);
    if (at <= 0 || Math.abs(points[at][0] - x) < 0.1 || Math.abs(points[at - 1][0] - x) < 0.1) return;
    points.splice(at, 0, [round(x), round(clamp(y, points[at - 1][1], points[at][1]))]);
    dragging = selected = at; svg.setPointerCapture(e.pointerId); draw();
  });
  svg.addEventListener("pointermove", (e) => {
    if (dragging < 0) return;
    const [x, y] = toData(e); move(dragging, x, y); draw();
  });
  const end = () => { dragging = -1; };
  svg.addEventListener("pointerup", end); svg.addEventListener("pointercancel", end);
  svg.addEventListener("dblclick", (e) => { const i = e.target.dataset?.index; if (i !== undefined) remove(Number(i)); });
  svg.addEventListener("keydown", (e) => {
    const i = Number(e.target.dataset?.index ?? -1);
    if (i < 0) return;
    const step = e.shiftKey ? 2 : 0.5;
    const [x, y] = points[i];
    const moves = { ArrowUp: [x, y + step], ArrowDown: [x, y - step], ArrowLeft: [x - step, y], ArrowRight: [x + step, y] };
    if (moves[e.key]) { move(i, ...moves[e.key]); selected = i; draw(); focusPoint(i); e.preventDefault(); }
    else if (e.key === "Delete" || e.key === "Backspace") { remove(i); e.preventDefault(); }
  });
}

function focusPoint(i) { $("plot").querySelector(`circle[data-index="${i}"]`)?.focus(); }

function base() {
  const value = $("server").value.trim().replace(/\/+$/, "");
  return value || "";
}

async function call(path, body) {
  const headers = { "content-type": "application/json" };
  const key = $("key").value.trim();
  if (key) headers.authorization = `Bearer ${key}`;
  const r = await fetch(base() + path, { method: "POST", headers, body: JSON.stringify(body) });
  let data = null;
  try { data = await r.json(); } catch { data = null; }
  if (!r.ok) {
    const msg = typeof data?.error === "string" ? data.error : data?.error?.message || `${r.status} ${r.statusText}`;
    throw new Error(msg);
  }
  return data;
}

function status(text, error = false) {
  const s = $("status");
  s.textContent = text; s.classList.toggle("error", error); s.classList.toggle("muted", !error);
}

async function readSignal() {
  status("Reading the model's next-token distribution…");
  try {
    const out = await call("/signal", { prompt: $("prompt").value });
    bins = out.bins; vocab = out.vocab;
    const shown = bins.reduce((a, b) => a + b, 0) - bins[0];
    $("signal-note").textContent = `Signal: the next token's log-probabilities over all ${vocab} tokens of the ` +
      `vocabulary; ${shown} lie above −19.75 (the leftmost bar also counts everything below −20).`;
    status(""); draw();
  } catch (err) { status(err.message, true); }
}

function escaped(text) {
  const shown = JSON.stringify(text).slice(1, -1);
  return shown.length > 60 ? `${shown.slice(0, 60)}…` : shown;
}

function sampleList(samples) {
  return samples.map((s, i) => h("article", { class: "sample" },
    h("div", { class: "row sample-head" }, h("span", { class: "muted small" }, `#${i + 1}`),
      s.junk ? h("span", { class: "badge bad", title: "the coherence heuristic tripped" }, "junk")
        : h("span", { class: "badge ok" }, "coherent")),
    s.text.trim() ? h("p", { class: "sample-text" }, s.text)
      : h("p", { class: "sample-text muted" }, s.text ? `(whitespace only: ${escaped(s.text)})` : "(empty)")));
}

async function generate() {
  const n = Number($("n").value), maxTokens = Number($("max-tokens").value), seed = Number($("seed").value);
  const ask = { prompt: $("prompt").value, n, max_tokens: maxTokens, seed };
  const button = $("generate");
  button.disabled = true;
  status("Generating with the curve, then with the model's default…");
  try {
    const curve = await call("/generate", { ...ask, curve: { points } });
    $("curve-samples").replaceChildren(...sampleList(curve.samples));
    const plain = await call("/generate", { ...ask, default: true });
    $("default-samples").replaceChildren(...sampleList(plain.samples));
    const r = plain.recipe || {};
    $("recipe").textContent = `temperature ${r.temperature} · top-p ${r.topP || "off"} · top-k ${r.topK || "off"}`;
    status(`${n} samples each, seed ${seed}.`);
  } catch (err) { status(err.message, true); }
  finally { button.disabled = false; }
}

function init() {
  themeButton();
  $("server").value = location.protocol.startsWith("http") ? location.origin : "http://127.0.0.1:8080";
  for (const b of document.querySelectorAll("[data-preset]")) {
    b.addEventListener("click", () => { points = PRESETS[b.dataset.preset].map((p) => [...p]); selected = -1; draw(); });
  }
  $("read-signal").addEventListener("click", readSignal);
  $("generate").addEventListener("click", generate);
  wirePlot();
  draw();
}

init();
