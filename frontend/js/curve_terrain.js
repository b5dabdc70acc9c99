// The Curve Terrain (/curve-terrain): the HLG tone curve family as a surface, drawn from GET /curve-terrain/surface
// (serving/routes/curve_designer.py, computed by inference/engine/hlg.py's own `transfer`). An isometric mesh: depth
// below the top logit runs across, the varied span runs back, and the curve's output is height; quads are painted back
// to front and shaded by how far down they lie. The ridge line is the curve with the server's (or these) spans.
import { svg as el, themeButton } from "./util.js";

const SPANS = ["width", "shoulder", "toe", "pivot_offset"];
const W = 640, H = 420, COS = Math.cos(Math.PI / 6), SIN = Math.sin(Math.PI / 6);
const $ = (id) => document.getElementById(id);
let server = null;  // the spans the server answered with (its --hlg-sampling defaults), once known
let pending = 0;

function query() {
  const q = new URLSearchParams({ vary: $("vary").value, low: $("low").value, high: $("high").value,
    depth: $("depth").value, steps: "25", points: "49" });
  for (const name of SPANS) {
    const input = $(`span-${name}`);
    if (input && input.value !== "" && name !== $("vary").value) q.set(name, input.value);
  }
  return q;
}

function draw(data) {
  const svg = $("terrain");
  svg.replaceChildren();
  const nx = data.depths.length, ny = data.values.length;
  const lowest = Math.min(...data.heights.flat());
  // Unit coordinates first (depth and span each 0..1, height 0..-1), then scaled to fit the plot whole.
  const raw = (i, j, z) => [(i / (nx - 1) - j / (ny - 1)) * COS, (i / (nx - 1) + j / (ny - 1)) * SIN
    - (z / Math.max(1e-9, -lowest)) * 0.75];
  const corners = [[0, 0], [nx - 1, 0], [0, ny - 1], [nx - 1, ny - 1]].flatMap(([i, j]) =>
    [raw(i, j, 0), raw(i, j, data.heights[j][i])]);
  const xs = corners.map((c) => c[0]), ys = corners.map((c) => c[1]);
  const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const margin = 34, scale = Math.min((W - 2 * margin) / (x1 - x0), (H - 2 * margin) / (y1 - y0));
  const at = (i, j, z) => {
    const [x, y] = raw(i, j, z);
    return [margin + (x - x0) * scale, margin + (y - y0) * scale];
  };
  const quads = [];
  for (let j = 0; j < ny - 1; j++) {
    for (let i = 0; i < nx - 1; i++) {
      quads.push({ i, j, z: [data.heights[j][i], data.heights[j][i + 1], data.heights[j + 1][i + 1], data.heights[j + 1][i]] });
    }
  }
  quads.sort((a, b) => (a.i + a.j) - (b.i + b.j) || a.i - b.i);  // far to near
  const g = el("g", { class: "mesh" });
  for (const { i, j, z } of quads) {
    const points = [at(i, j, z[0]), at(i + 1, j, z[1]), at(i + 1, j + 1, z[2]), at(i, j + 1, z[3])];
    const deep = -(z[0] + z[1] + z[2] + z[3]) / 4 / Math.max(1e-9, -lowest);
    g.append(el("polygon", { points: points.map((c) => c.join(",")).join(" "),
      style: `fill: hsl(${24 + deep * 190} 62% ${62 - deep * 22}%)` }));
  }
  svg.append(g);
  // The ridge: the varied span at the value nearest the one in use.
  const used = Number($(`span-${data.vary}`)?.value || server?.[data.vary] || data.params[data.vary]);
  const k = data.values.reduce((best, v, n) => (Math.abs(v - used) < Math.abs(data.values[best] - used) ? n : best), 0);
  svg.append(el("polyline", { class: "ridge", points: data.heights[k].map((z, i) => at(i, k, z).join(",")).join(" ") }));
  const [ax, ay] = at(nx - 1, 0, 0), [bx, by] = at(0, ny - 1, 0), [cx, cy] = at(0, 0, 0);
  svg.append(el("text", { x: (cx + ax) / 2 + 6, y: (cy + ay) / 2 - 8 }, `depth below the top → ${data.depths.at(-1)}`));
  svg.append(el("text", { x: (cx + bx) / 2 - 6, y: (cy + by) / 2 - 8, "text-anchor": "end" },
    `← ${data.vary} ${data.values[0]} to ${data.values.at(-1)}`));
  $("readout").textContent = `ridge: ${data.vary} = ${data.values[k].toFixed(2)}; deepest ${lowest.toFixed(1)} logits`;
}

async function load() {
  const ticket = ++pending;
  const answer = await fetch(`/curve-terrain/surface?${query()}`, { credentials: "same-origin" });
  const body = await answer.json().catch(() => ({}));
  if (ticket !== pending) return;  // a newer request is on its way
  if (!answer.ok) { $("status").textContent = body.error?.message || `HTTP ${answer.status}`; return; }
  $("status").textContent = "";
  if (!server) {
    server = body.params;
    for (const name of SPANS) {
      const input = $(`span-${name}`);
      if (input) input.value = server[name];
    }
  }
  $("terrain-title").textContent = `Terrain over ${body.vary}`;
  draw(body);
}

function setup() {
  const spans = $("spans");
  for (const name of SPANS) {
    const input = document.createElement("input");
    Object.assign(input, { id: `span-${name}`, type: "number", min: "0", max: "64", step: "0.5" });
    const label = document.createElement("label");
    label.append(name, input);
    spans.append(label);
  }
  const sync = () => {
    for (const name of SPANS) $(`span-${name}`).disabled = name === $("vary").value;
  };
  sync();
  for (const id of ["vary", "low", "high", "depth", ...SPANS.map((n) => `span-${n}`)]) {
    $(id).addEventListener("change", () => { sync(); load(); });
  }
  themeButton();
  load();
}

setup();
