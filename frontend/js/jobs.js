// Jobs: the list, and one job's live events with a loss curve.
import { pushForm } from "./push.js";
import { api, bar, every, h, toast } from "./util.js";

const PUSHED = new Set(["quantize", "finetune", "dataset"]);  // kinds whose output can go to the Hub

export function jobsPage(main, [jobId]) {
  if (jobId) return jobDetail(main, jobId);
  const list = h("div", { class: "table-wrap" });
  main.append(h("div", { class: "page" }, h("h1", {}, "Jobs"), list));
  return every(2000, async () => {
    const r = await api("/api/jobs?limit=50");
    list.replaceChildren(r.jobs.length ? h("table", {}, h("thead", {}, h("tr", {}, ...["job", "kind", "status", "progress",
      "message"].map((t) => h("th", {}, t)))), h("tbody", {}, ...r.jobs.map((j) => h("tr", {},
      h("td", {}, h("a", { href: `#/jobs/${j.id}` }, j.id)), h("td", {}, j.kind), h("td", {}, status(j.status)),
      h("td", { style: "min-width:120px" }, bar(j.progress, `${j.id} progress`)),
      h("td", { class: "small muted" }, j.error || summary(j.message)))))) : h("p", { class: "muted" },
      "No jobs yet: start one from Fine-tune, Quantize or Dataset."));
  });
}

// A job's summary: a finished job's message (its summary as JSON) or an event's object. The short fields show
// ("method sft · iters 10 · …"); paths and nested values stay in the API. Plain text passes as it is.
function summary(value) {
  let fields = value;
  if (typeof value === "string") {
    if (value[0] !== "{") return value;
    try { fields = JSON.parse(value); } catch { return value; }
  }
  if (!fields || typeof fields !== "object") return value == null ? "" : String(value);
  return Object.entries(fields).filter(([, v]) => v !== null && typeof v !== "object" && String(v).length < 40)
    .slice(0, 6).map(([k, v]) => `${k} ${v}`).join(" · ");
}

export function status(s) {
  const cls = { done: "ok", failed: "bad", zombie: "bad", cancelled: "warn" }[s] || "";
  return h("span", { class: `badge ${cls}` }, s);
}

function jobDetail(main, id) {
  const head = h("div");
  const progress = h("div");
  const canvas = h("canvas", { class: "curve", width: 900, height: 220, role: "img", "aria-label": "Loss curve" });
  const log = h("div", { class: "events", tabindex: 0, "aria-label": "Job events" });
  const train = [], val = [];
  main.append(h("div", { class: "page" }, h("p", {}, h("a", { href: "#/jobs" }, "‹ All jobs")), head, progress,
    h("h2", {}, "Loss"), canvas, h("h2", {}, "Events"), log));
  const source = new EventSource(`/api/jobs/${id}/stream`);
  source.onmessage = (e) => {
    const ev = JSON.parse(e.data);
    if (ev.type === "metric") (ev.kind === "val" ? val : train).push(ev);
    if (ev.type === "metric") draw(canvas, train, val);
    log.append(`${new Date((ev.ts || 0) * 1000).toLocaleTimeString()}  ${ev.type}  ${describe(ev)}\n`);
    log.scrollTop = log.scrollHeight;
    refresh();
  };
  source.addEventListener("end", () => { source.close(); refresh(); });
  async function refresh() {
    try {
      const { job } = await api(`/api/jobs/${id}`);
      const live = job.status === "queued" || job.status === "running";
      head.replaceChildren(h("h1", {}, `${job.kind} ${job.id} `, status(job.status)),
        job.error ? h("p", { class: "error" }, job.error) : "",
        job.output_path ? h("p", { class: "small" }, "Output: ", h("code", {}, job.output_path)) : "",
        job.status === "done" && job.output_path && PUSHED.has(job.kind) && !head.querySelector(".push")
          ? pushForm(job.kind, { job_id: job.id }, `the output of job ${job.id}`) : head.querySelector(".push") || "",
        live ? h("button", { type: "button", onclick: async () => { await api(`/api/jobs/${id}/cancel`, { method: "POST" })
          .catch((e) => toast(e.message)); refresh(); } }, "Cancel") : "");
      progress.replaceChildren(bar(job.progress, "job progress"), h("p", { class: "muted small job-message" },
        `${Math.round(job.progress * 100)}% ${summary(job.message)}`));
    } catch (e) { head.replaceChildren(h("p", { class: "error" }, e.message)); }
  }
  refresh();
  return () => source.close();
}

function describe(ev) {
  const { type, ts, ...rest } = ev;
  if (type === "log") return rest.line;
  if (type === "stage") return `${rest.stage}: ${rest.message || ""}`;
  if (type === "metric") return `${rest.kind} step ${rest.step}: loss ${Number(rest.loss).toFixed(4)}`;
  if (type === "done") {
    return [rest.output_dir ? `output ${rest.output_dir}` : "", summary(rest.summary)].filter(Boolean).join(" · ");
  }
  if (type === "failed") return rest.error || "";
  return summary(rest);
}

function draw(canvas, train, val) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, hgt = canvas.height, pad = 36;
  const css = getComputedStyle(document.documentElement);
  ctx.clearRect(0, 0, w, hgt);
  const all = [...train, ...val];
  if (!all.length) return;
  const maxStep = Math.max(...all.map((p) => p.step)), losses = all.map((p) => p.loss);
  const lo = Math.min(...losses), hi = Math.max(...losses), span = hi - lo || 1;
  const x = (s) => pad + (s / (maxStep || 1)) * (w - pad * 2);
  const y = (l) => hgt - pad - ((l - lo) / span) * (hgt - pad * 2);
  ctx.strokeStyle = css.getPropertyValue("--line"); ctx.fillStyle = css.getPropertyValue("--muted");
  ctx.font = "12px system-ui"; ctx.beginPath(); ctx.moveTo(pad, pad); ctx.lineTo(pad, hgt - pad); ctx.lineTo(w - pad, hgt - pad);
  ctx.stroke();
  ctx.fillText(hi.toFixed(3), 2, pad); ctx.fillText(lo.toFixed(3), 2, hgt - pad); ctx.fillText(`step ${maxStep}`, w - pad - 50, hgt - 10);
  for (const [points, color] of [[train, css.getPropertyValue("--accent")], [val, css.getPropertyValue("--ok")]]) {
    if (!points.length) continue;
    ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
    points.forEach((p, i) => (i ? ctx.lineTo(x(p.step), y(p.loss)) : ctx.moveTo(x(p.step), y(p.loss))));
    ctx.stroke();
    for (const p of points) { ctx.fillStyle = color; ctx.fillRect(x(p.step) - 2, y(p.loss) - 2, 4, 4); }
  }
}
