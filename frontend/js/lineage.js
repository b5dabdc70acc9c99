// Lineage (/dag, #/lineage): the library as a graph, live from GET /api/lineage (jobs/lineage.py). It reads left to
// right from what a model came from to what serves it: each node stands one column right of the furthest node it came
// from (so every edge points right; what this server has loaded just right of its model), and within a column nodes
// sit near the average height of where they came from. Each node links to its page.
import { api, every, h, svg as el } from "./util.js";

const KINDS = [["model", "model"], ["dataset", "dataset"], ["job", "job"], ["adapter", "adapter"], ["export", "export"],
  ["served", "served here"]];
const NODE_W = 170, NODE_H = 34, GAP_X = 40, GAP_Y = 14, TOP = 8;
const STATUS = { done: "ok", failed: "bad", zombie: "bad", cancelled: "warn", running: "run", queued: "" };

function layout(graph) {
  const linked = new Set(graph.edges.flatMap((e) => [e.source, e.target]));
  const shown = graph.nodes.filter((n) => linked.has(n.id));
  const byId = new Map(shown.map((n) => [n.id, n]));
  const from = new Map(shown.map((n) => [n.id, []]));
  for (const e of graph.edges) if (byId.has(e.source) && byId.has(e.target)) from.get(e.target).push(e.source);
  const depth = new Map(), visiting = new Set();
  const depthOf = (id) => {
    if (depth.has(id)) return depth.get(id);
    if (visiting.has(id)) return 0;  // a cycle (two rows naming each other): cut it here
    visiting.add(id);
    const d = Math.max(-1, ...from.get(id).map(depthOf)) + 1;
    visiting.delete(id);
    depth.set(id, d);
    return d;
  };
  shown.forEach((n) => depthOf(n.id));  // a served model stands just right of the model it serves
  const columns = [];
  for (const n of shown) (columns[depth.get(n.id)] ||= []).push(n);
  const row = new Map(), at = new Map();
  let tallest = 0;
  columns.forEach((nodes = [], c) => {
    const place = (n) => {
      const rows = from.get(n.id).filter((f) => row.has(f)).map((f) => row.get(f));
      return rows.length ? rows.reduce((a, b) => a + b, 0) / rows.length : Infinity;
    };
    const served = (n) => (n.kind === "served" ? 1 : 0);  // below what else stands there: long edges pass above it
    nodes.sort((a, b) => served(a) - served(b) || place(a) - place(b) || a.label.localeCompare(b.label));
    nodes.forEach((n, i) => {
      row.set(n.id, i);
      at.set(n.id, { x: c * (NODE_W + GAP_X), y: TOP + i * (NODE_H + GAP_Y), node: n });
    });
    tallest = Math.max(tallest, nodes.length);
  });
  return { at, width: columns.length * (NODE_W + GAP_X) - GAP_X, height: TOP + tallest * (NODE_H + GAP_Y),
    unlinked: graph.nodes.length - shown.length };
}

// Draws the graph; answers how many nodes stood apart (no edge), which are counted below it, not drawn.
function draw(svg, graph) {
  const { at, width, height, unlinked } = layout(graph);
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${Math.max(width, 300)} ${Math.max(height, 60)}`);
  svg.setAttribute("width", Math.max(width, 300));
  svg.setAttribute("height", Math.max(height, 60));
  for (const edge of graph.edges) {
    const a = at.get(edge.source), b = at.get(edge.target);
    if (!a || !b) continue;
    const x1 = a.x + NODE_W, y1 = a.y + NODE_H / 2, x2 = b.x, y2 = b.y + NODE_H / 2, bend = Math.max(24, (x2 - x1) / 2);
    svg.append(el("path", { class: `edge${b.node.kind === "served" ? " serves" : ""}`,
      d: `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}` }));
  }
  for (const { x, y, node } of at.values()) {
    const link = el("a", { href: node.href, "data-node": node.id, class: `node ${node.kind} ${STATUS[node.status] ?? ""}` });
    const title = el("title", {}, [`${node.kind}: ${node.label}`, node.path, node.status].filter(Boolean).join("\n"));
    const name = node.kind === "model" || node.kind === "served" ? node.label.split("/").pop() : node.label;
    const text = node.kind === "job" && node.status !== "done" ? `${node.job_kind} · ${node.status}` : name;
    const label = text.length > 23 ? `…${text.slice(-22)}` : text;
    link.append(title, el("rect", { x, y, width: NODE_W, height: NODE_H, rx: 6 }),
      el("text", { x: x + 10, y: y + NODE_H / 2 + 4 }, label));
    svg.append(link);
  }
  return unlinked;
}

function legend() {
  return h("div", { class: "legend small muted" }, ...KINDS.map(([kind, name]) =>
    h("span", {}, h("i", { class: `swatch ${kind}` }), name)));
}

export function lineagePage(main) {
  const svg = el("svg", { role: "img", "aria-label": "Lineage graph" });
  const note = h("p", { class: "muted small" });
  const EMPTY = "Nothing made here yet: quantize a model, build a dataset or fine-tune an adapter, and what it came "
    + "from shows up here.";
  main.append(h("div", { class: "page lineage" }, h("h1", {}, "Lineage"),
    h("p", { class: "muted" }, "Where each model and adapter came from and what serves it, from the jobs, adapters "
      + "and exports this server keeps. Click a node for its page."), legend(), h("div", { class: "graph-wrap" }, svg),
    note));
  let last = "";
  return every(3000, async () => {
    const graph = await api("/api/lineage");
    const key = JSON.stringify(graph);
    if (key === last) return;  // redrawn only when something changed
    last = key;
    const unlinked = draw(svg, graph);
    svg.parentElement.hidden = !graph.edges.length;
    note.textContent = !graph.edges.length ? EMPTY
      : unlinked ? `${unlinked} more in the library with no jobs, adapters or exports yet.` : "";
  });
}
