// Live engine state (/stats), the device and BLAS this server runs on (/stats `device`, `blas`) and this machine's fit
// for the model (/fit). One model's server reports its engine at the top level of /stats; a router (`hearth serve`
// with no model) reports each loaded model's own /stats under `models`, and the page shows a set of cards per
// loaded model, or only the one the route names (#/status/<model id>, where the Lineage page's "served" nodes link).
import { demoBuildCards } from "./demo_build.js";
import { api, bytes, every, h } from "./util.js";

function kv(pairs) {
  return h("dl", { class: "kv" }, ...pairs.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? "–")]));
}

function card(title, ...body) {
  return h("div", { class: "card" }, h("h2", { style: "margin-top:0" }, title), ...body);
}

// [model id, that model's /stats] for each model this server has loaded (the chosen one only, when one is named).
export function servedModels(s, chosen) {
  const all = s.router ? Object.entries(s.models || {}).filter(([, m]) => m?.server?.model)
    : s.server?.model ? [[s.server.model, s]] : [];
  return chosen ? all.filter(([id]) => id === chosen) : all;
}

// The four cards of one loaded model, from its /stats.
function modelCards(id, s) {
  const e = s.engine || {}, b = s.batch || {}, pc = s.prompt_cache || {}, ad = s.admission || {};
  return h("div", { class: "grid", "data-model": id },
    card("Model", kv([["served", id], ["dtype", e.dtype], ["lane", b.mode || b.lane],
      ["adapters", (s.adapters?.mounted || []).join(", ") || "none"], ["speculation", specLine(s.speculation)]])),
    card("Rows", kv([["decoding", e.active],
      ["most at once", b.max_rows ? `${b.max_rows}${b.configured === "auto" ? " (auto)" : ""}, peak ${e.peak_rows}` : "—"],
      ["waiting", e.queued], ["requests", e.requests_total],
      ["last decode", e.last_decode_tokens_per_s != null ? `${e.last_decode_tokens_per_s} tok/s` : null]])),
    card("Prompt cache", kv([["entries", pc.entries], ["size", bytes(pc.bytes)],
      ["hits / misses", pc.hits != null ? `${pc.hits} / ${pc.misses}` : null], ["cached tokens", e.cached_tokens_total]])),
    card("Admission", kv([["context limit", ad.max_safe_context ?? ad.enforced_context ?? "model window"],
      ["KV per token", bytes(ad.kv_bytes_per_token)], ["usable memory", bytes(ad.usable_bytes)],
      ["queue limit", ad.max_queued]])));
}

// What stands where the cards would: no model loaded (or not the one the route names), and what to do about it.
function emptyState(s, chosen) {
  const models = h("a", { href: "#/models" }, "Models page");
  if (chosen) {
    return h("div", { class: "card empty-state", role: "status" }, h("p", {}, h("strong", {}, chosen), " is not loaded."),
      h("p", { class: "muted small" }, "Load it on the ", models, ", or ", h("a", { href: "#/status" }, "show every loaded model"), "."));
  }
  if (!s.router) {
    return h("div", { class: "card empty-state", role: "status" }, h("p", {}, "The model is still loading."),
      h("p", { class: "muted small" }, "Its rows, prompt cache and admission limits show here once it serves."));
  }
  return h("div", { class: "card empty-state", role: "status" }, h("p", {}, "No model is loaded."),
    h("p", { class: "muted small" }, "Load one on the ", models, ", or send a request that names one: it loads then. ",
      s.router.default ? `The default, ${s.router.default}, answers requests that name no model.` : ""));
}

// One model's cards, under its name when a router may show several.
function modelSection(id, s, named) {
  if (!named) return modelCards(id, s);
  return h("section", { class: "served-model" }, h("h2", {}, h("a", { href: `#/status/${id}` }, id)), modelCards(id, s));
}

// The model /fit describes: the chosen one, else the router's default if loaded, else the first loaded.
function fitModel(s, served) {
  if (!s.router) return served.length ? "" : null;  // one model's server: /fit answers for it
  const ids = served.map(([id]) => id);
  return ids.includes(s.router.default) ? s.router.default : ids[0] ?? null;
}

export function statusPage(main, rest = []) {
  const chosen = rest.filter(Boolean).join("/") || null;
  const live = h("div", { class: "served" });
  const demo = h("div");
  const fit = h("div");
  const blas = h("div", { id: "blas" });
  main.append(h("div", { class: "page status" }, h("h1", {}, "Status"), demo, live, h("h2", {}, "This machine"), fit,
    h("h2", {}, "Device and BLAS"), blas));
  let fitFor;  // the model the fit cards describe ("" for one model's server), null for none yet
  const stopLive = every(1500, async () => {
    const s = await api("/stats");
    if (s.blas && !blas.childElementCount) {  // fixed for the process's life
      blas.replaceChildren(deviceCard(s.device), blasCard(s.blas));
    }
    demo.replaceChildren(...demoBuildCards(s));
    const served = servedModels(s, chosen);
    live.replaceChildren(...(served.length ? served.map(([id, m]) => modelSection(id, m, Boolean(s.router)))
      : [emptyState(s, chosen)]));
    const model = fitModel(s, served);
    if (model === fitFor) return;
    fitFor = model;  // asked again at the next tick if the answer fails, and a late answer for another is dropped
    if (model === null) fit.replaceChildren(h("p", { class: "muted" }, "The fit of a model shows once one is loaded."));
    else loadFit(fit, model, () => fitFor === model).then((ok) => { if (!ok && fitFor === model) fitFor = undefined; });
  });
  return stopLive;
}

// This machine's hardware, the fit of `model` on it (`""`: the one model this server serves) and other machines'.
function loadFit(fit, model, current = () => true) {
  const query = model ? `?model=${encodeURIComponent(model)}` : "";
  return api(`/fit${query}`).then((f) => {
    if (!current()) return true;
    const m = f.machine, r = f.report;
    const measure = h("button", { type: "button", onclick: async (e) => {
      e.target.disabled = true;
      try { await api("/api/fit/measure", { json: model ? { tokens: 64, model } : { tokens: 64 } }); await loadFit(fit, model, current); }
      catch (err) { e.target.disabled = false; fit.append(h("p", { class: "error" }, err.message)); }
    } }, "Measure decode speed");
    fit.replaceChildren(h("div", { class: "grid wide" },
      card("Hardware", kv([["chip", m.chip], ["RAM", bytes(m.ram_bytes)], ["usable", bytes(m.usable_bytes)],
        ["cores", m.cores], ["memory bandwidth", `${m.bandwidth_gbs} GB/s`], ["decode bandwidth", `${m.decode_bandwidth_gbs} GB/s`]]),
        m.measured_while_busy ? h("p", { class: "muted small" }, "The machine was busy while its bandwidth was measured: "
          + "it is measured again at the next start.") : ""),
      card(`Fit of ${f.model}`, kv([["fits", r.fits ? "yes" : "no"], ["weights", bytes(r.weights_bytes)],
        ["KV per token", bytes(r.kv_bytes_per_token)], ["max safe context", r.max_safe_context],
        ["predicted decode", `${r.predicted_decode_tps} tok/s`],
        ["measured decode", f.measured_decode_tps ? `${f.measured_decode_tps} tok/s` : "not measured"]]), measure)),
      ...skuTable(f));
    return true;
  }).catch((e) => { if (current()) fit.replaceChildren(h("p", { class: "error" }, e.message)); return false; });
}

// Other machines' fit. Each row's decode is predicted at `sku_matrix_ctx` tokens of context, or the most that row's
// machine holds; the model's own window caps every row, and the heading says so when it is the smaller.
function skuTable(f) {
  const window = f.context_window, asked = f.sku_matrix_ctx;
  const capped = window && window < asked;
  const heading = h("h2", {}, `Other machines at ${capped ? window : asked} tokens`);
  const note = h("p", { class: "muted small sku-note" }, capped
    ? `${f.model} reads at most ${window} tokens (its own context window), so no machine gives it more: each row `
      + `is predicted at ${window}, or at the most its machine holds (max context).`
    : `Decode predicted with ${asked} tokens of context, or the most that fits on that machine (max context).`);
  return [heading, note, h("div", { class: "table-wrap" }, h("table", { class: "sku" }, h("thead", {}, h("tr", {},
    h("th", {}, "machine"), h("th", {}, "fits"), h("th", {}, "max context"), h("th", {}, "decode"))),
  h("tbody", {}, ...f.sku_matrix.map((s) => h("tr", {}, h("td", {}, s.sku), h("td", {}, s.fits ? "yes" : "no"),
    h("td", {}, s.max_context), h("td", {}, `${s.decode_tps} tok/s`))))))];
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
