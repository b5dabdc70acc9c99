// Live engine state (/stats), the device and BLAS this server runs on (/stats `device`, `blas`) and this machine's fit
// for the model (/fit).
import { demoBuildCards } from "./demo_build.js";
import { api, bytes, every, h } from "./util.js";

function kv(pairs) {
  return h("dl", { class: "kv" }, ...pairs.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? "–")]));
}

export function statusPage(main) {
  const live = h("div", { class: "grid" });
  const demo = h("div");
  const fit = h("div");
  const blas = h("div", { id: "blas" });
  main.append(h("div", { class: "page" }, h("h1", {}, "Status"), demo, live, h("h2", {}, "This machine"), fit,
    h("h2", {}, "Device and BLAS"), blas));
  const stopLive = every(1500, async () => {
    const s = await api("/stats");
    if (s.blas && !blas.childElementCount) {  // fixed for the process's life
      blas.replaceChildren(deviceCard(s.device), blasCard(s.blas));
    }
    demo.replaceChildren(...demoBuildCards(s));
    const e = s.engine || {}, b = s.batch || {}, pc = s.prompt_cache || {}, ad = s.admission || {};
    live.replaceChildren(
      h("div", { class: "card" }, h("h2", { style: "margin-top:0" }, "Model"), kv([["served", s.server?.model],
        ["dtype", e.dtype], ["lane", b.mode || b.lane], ["adapters", (s.adapters?.mounted || []).join(", ") || "none"],
        ["speculation", specLine(s.speculation)]])),
      h("div", { class: "card" }, h("h2", { style: "margin-top:0" }, "Rows"), kv([["decoding", e.active],
        ["most at once", b.max_rows ? `${b.max_rows}${b.configured === "auto" ? " (auto)" : ""}, peak ${e.peak_rows}` : "—"],
        ["waiting", e.queued], ["requests", e.requests_total], ["last decode", e.last_decode_tokens_per_s != null ? `${e.last_decode_tokens_per_s} tok/s` : null]])),
      h("div", { class: "card" }, h("h2", { style: "margin-top:0" }, "Prompt cache"), kv([["entries", pc.entries],
        ["size", bytes(pc.bytes)], ["hits / misses", pc.hits != null ? `${pc.hits} / ${pc.misses}` : null],
        ["cached tokens", e.cached_tokens_total]])),
      h("div", { class: "card" }, h("h2", { style: "margin-top:0" }, "Admission"), kv([
        ["context limit", ad.max_safe_context ?? ad.enforced_context ?? "model window"],
        ["KV per token", bytes(ad.kv_bytes_per_token)], ["usable memory", bytes(ad.usable_bytes)],
        ["queue limit", ad.max_queued]])));
  });
  const loadFit = () => api("/fit").then((f) => {
    const r = f.report;
    fit.replaceChildren(h("div", { class: "grid" },
      h("div", { class: "card" }, h("h2", { style: "margin-top:0" }, "Hardware"), kv([["chip", f.machine.chip], ["RAM", bytes(f.machine.ram_bytes)],
        ["usable", bytes(f.machine.usable_bytes)], ["cores", f.machine.cores],
        ["memory bandwidth", `${f.machine.bandwidth_gbs} GB/s`], ["decode bandwidth", `${f.machine.decode_bandwidth_gbs} GB/s` + (f.machine.measured_while_busy ? " (machine busy: measured again at next start)" : "")]])),
      h("div", { class: "card" }, h("h2", { style: "margin-top:0" }, `Fit of ${f.model}`), kv([["fits", r.fits ? "yes" : "no"], ["weights", bytes(r.weights_bytes)],
        ["KV per token", bytes(r.kv_bytes_per_token)], ["max safe context", r.max_safe_context],
        ["predicted decode", `${r.predicted_decode_tps} tok/s`],
        ["measured decode", f.measured_decode_tps ? `${f.measured_decode_tps} tok/s` : "not measured"]]),
        h("button", { type: "button", onclick: async (e) => { e.target.disabled = true;
          try { await api("/api/fit/measure", { json: { tokens: 64 } }); await loadFit(); }
          catch (err) { e.target.disabled = false; fit.append(h("p", { class: "error" }, err.message)); } } },
          "Measure decode speed"))),
      h("h2", {}, `Other machines at ${f.sku_matrix_ctx} tokens`),
      h("div", { class: "table-wrap" }, h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "machine"), h("th", {}, "fits"),
        h("th", {}, "max context"), h("th", {}, "decode"))), h("tbody", {}, ...f.sku_matrix.map((s) => h("tr", {},
        h("td", {}, s.sku), h("td", {}, s.fits ? "yes" : "no"), h("td", {}, s.max_context), h("td", {}, `${s.decode_tps} tok/s`)))))));
  }).catch((e) => fit.replaceChildren(h("p", { class: "error" }, e.message)));
  loadFit();
  return stopLive;
}

const CHOSEN = { measurement: "chosen by measurement", option: "chosen with --blas (override)",
  env: "chosen with HEARTH_BLAS (override)", fallback: "the fallback (nothing measured faster)",
  platform: "the platform's own", LD_PRELOAD: "preloaded by the environment", default: "the MLX wheel's own" };

const BACKENDS = { cuda: "NVIDIA GPU (MLX's CUDA build)", metal: "Apple GPU (Metal)", cpu: "CPU" };

// Where MLX computes: the device, and the memory models live in.
function deviceCard(d) {
  if (!d) return h("div");
  return h("div", { class: "card", style: "margin-bottom:1rem" }, h("h2", { style: "margin-top:0" }, "Device"), kv([["computes on", BACKENDS[d.backend] || d.backend],
    ["name", d.name], ["memory", bytes(d.memory_bytes)]]));
}

// The library in use, how it was picked, and each installed library's measured GFLOP/s.
function blasCard(b) {
  if (b.in_use === false) {
    return h("div", { class: "card" }, h("h2", { style: "margin-top:0" }, "BLAS"),
      h("p", {}, "None: MLX computes on the GPU, so no CPU BLAS is measured or chosen."));
  }
  const sizes = (b.shapes || []).map(([m]) => String(m));
  const rows = (b.candidates || []).slice().sort((x, y) => y.score - x.score).map((c) => h("tr", {},
    h("td", {}, c.name === b.name ? h("strong", {}, `${c.name} (in use)`) : c.name),
    ...(c.ok ? [h("td", {}, c.score.toFixed(1)), ...sizes.map((m) => h("td", {}, (c.gflops[m] ?? 0).toFixed(1)))]
      : [h("td", { colspan: sizes.length + 1, class: "error" }, `rejected: ${c.error}`)]),
    h("td", { class: "muted small" }, c.library || "bundled with MLX")));
  const busy = b.others_cpu > 0.25 ? ` (other processes used ${Math.round(100 * b.others_cpu)}% of the CPU meanwhile)` : "";
  const measured = b.measured_at ? new Date(b.measured_at).toLocaleString() + busy : "not measured on this machine";
  return h("div", { class: "card" }, h("h2", { style: "margin-top:0" }, "BLAS"), kv([["library", b.label], ["file", h("span", { style: "overflow-wrap:anywhere" }, b.library || "bundled with MLX")],
    ["chosen", CHOSEN[b.chosen_by] || b.chosen_by], ["measured", measured]]),
    rows.length ? h("div", { class: "table-wrap" }, h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "library"),
      h("th", {}, "score"), ...sizes.map((m) => h("th", {}, `M=${m} GFLOP/s`)), h("th", {}, "file"))),
      h("tbody", {}, ...rows))) : h("p", { class: "muted small" }, h("code", {}, "hearth blas --measure"), " measures the installed libraries."),
    h("p", { class: "muted small" }, "Score: the geometric mean of MLX float32 GFLOP/s at M = 1, 8 and 32 rows "
      + "against a 2048 x 2048 weight; the highest wins at the first start. ", h("code", {}, "--blas NAME"), " or ",
      h("code", {}, "HEARTH_BLAS"), " overrides it."));
}

// The draft source and how often its guesses were kept, from /stats speculation.
function specLine(sp) {
  if (!sp) return "off";
  if (sp.off) return `off (${sp.off})`;
  const rate = sp.acceptance == null ? "no drafts yet" : `${Math.round(sp.acceptance * 100)}% of drafts kept`;
  return `${sp.kind === "model" ? `draft model ${sp.draft_model}` : "prompt lookup"}, ${rate}`;
}
