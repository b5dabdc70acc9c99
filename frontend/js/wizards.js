// Step-by-step wizards for fine-tune, quantize and dataset jobs. Each step
// validates before the next; the last step submits and follows the job.
// Each step shown fires `hearth:step` on window ({ index, count, label, rail });
// the fields the assistant may point at are registered with their step (appctx.js).
import { registerSpot } from "./appctx.js";
import { api, h, toast } from "./util.js";

function field(label, input, hint) {
  const id = `f-${Math.random().toString(36).slice(2, 8)}`;
  input.id = id;
  return h("div", {}, h("label", { for: id }, label), input, hint ? h("div", { class: "hint" }, hint) : "");
}
const num = (value, attrs = {}) => { const el = h("input", { type: "number", ...attrs }); el.value = value; return el; };
const text = (value = "", attrs = {}) => { const el = h("input", { type: "text", ...attrs }); el.value = value; return el; };
function select(options, value) {
  const el = h("select", {}, ...options.map(([v, l]) => h("option", { value: v }, l)));
  el.value = value;
  return el;
}

// spots: [catalog id, field, step index, label] for the fields the assistant may spotlight.
function wizard(main, title, steps, finish, spots = []) {
  let at = 0;
  const rail = h("div", { class: "steps", "aria-label": "Steps" });
  const body = h("div", { class: "card" });
  const error = h("p", { class: "error", role: "alert" });
  const back = h("button", { type: "button", onclick: () => { at = Math.max(0, at - 1); show(); } }, "Back");
  const next = h("button", { class: "primary", type: "button", onclick: go });
  const root = h("div", { class: "page" }, h("h1", {}, title), rail, body, error, h("div", { class: "row" }, back, next));
  main.append(root);
  for (const [id, el, step, label] of spots) registerSpot(id, el, { step, stepLabel: steps[step].name, label, wizard: { root, rail } });
  async function go() {
    error.textContent = "";
    next.disabled = true;
    try {
      const problem = await steps[at].check?.();
      if (problem) { error.textContent = problem; return; }
      if (at === steps.length - 1) {
        const jobId = await finish();
        if (jobId) location.hash = `#/jobs/${jobId}`;
        return;
      }
      at += 1; show();
    } catch (e) { error.textContent = e.message; } finally { next.disabled = false; }
  }
  function show() {
    rail.replaceChildren(...steps.map((s, i) => h("span", { class: i === at ? "on" : "", "aria-current": i === at ? "step" : null },
      `${i + 1}. ${s.name}`)));
    body.replaceChildren(...(typeof steps[at].view === "function" ? steps[at].view() : steps[at].view));
    back.disabled = at === 0;
    next.textContent = at === steps.length - 1 ? "Start job" : "Next";
    if (!document.activeElement?.closest(".dock")) body.querySelector("input, select, textarea")?.focus();  // not while typing to the assistant
    dispatchEvent(new CustomEvent("hearth:step", { detail: { index: at, count: steps.length, label: steps[at].name, rail } }));
  }
  show();
}

async function servedModel() {
  try { return (await api("/v1/models")).data[0]?.id || ""; } catch { return ""; }
}

function finetune(main) {
  const model = text("", { placeholder: "org/name or a folder" });
  const data = text("", { placeholder: "/path/to/dataset (train.jsonl, valid.jsonl)" });
  const dataInfo = h("p", { class: "muted small" });
  const method = select([["sft", "SFT (supervised)"], ["dpo", "DPO (preferences)"], ["orpo", "ORPO (preferences)"]], "sft");
  const iters = num(200, { min: 1 }), lr = num(0.0002, { step: "any", min: 0 }), rank = num(16, { min: 1 });
  const batch = num(1, { min: 1 }), report = num(10, { min: 1 });
  const scope = select([["full", "whole example"], ["response", "reply only"]], "response");
  const adapterPath = text("", { placeholder: "default: under HEARTH_HOME/adapters" });
  servedModel().then((m) => { if (!model.value) model.value = m; });
  const ints = [[iters, "iterations"], [rank, "rank"], [batch, "batch size"], [report, "report every"]];
  wizard(main, "Fine-tune", [
    { name: "Model", view: () => [field("Base model", model, "The served model is filled in; any model in the library works.")],
      check: () => (model.value.trim() ? null : "Choose a model") },
    { name: "Data", view: () => [field("Dataset folder", data, "Build one on the Dataset page."), dataInfo],
      check: async () => {
        if (!data.value.trim()) return "Give the dataset folder";
        const r = await api("/api/finetune/inspect-dataset", { json: { path: data.value.trim() } }).catch((e) => e.body);
        if (!r?.ok) return r?.error || "The folder could not be read";
        dataInfo.textContent = `${r.n_train} training rows, ${r.n_valid} validation rows, format ${r.format}`;
        if ((r.format === "dpo") !== (method.value !== "sft")) method.value = r.format === "dpo" ? "dpo" : "sft";
        return null;
      } },
    { name: "Training", view: () => [dataInfo, field("Method", method), field("Iterations", iters), field("Learning rate", lr),
      field("LoRA rank", rank), field("Batch size", batch), field("Train on", scope), field("Report loss every", report, "steps")],
      check: () => {
        for (const [el, name] of ints) if (!(Number.isInteger(Number(el.value)) && Number(el.value) >= 1)) return `${name} must be a whole number ≥ 1`;
        return Number(lr.value) > 0 ? null : "The learning rate must be above 0";
      } },
    { name: "Review", view: () => [field("Adapter folder", adapterPath),
      h("p", {}, `${method.value.toUpperCase()} on ${model.value} for ${iters.value} steps at ${lr.value}, rank ${rank.value}.`)] },
  ], async () => {
    const body = { model_dir: model.value.trim(), data_dir: data.value.trim(), method: method.value, iters: Number(iters.value),
      learning_rate: Number(lr.value), rank: Number(rank.value), batch_size: Number(batch.value), sft_scope: scope.value,
      steps_per_report: Number(report.value) };
    if (adapterPath.value.trim()) body.adapter_path = adapterPath.value.trim();
    const r = await api("/api/finetune/submit", { json: body });
    toast(`Training into ${r.adapter_path}`);
    return r.job_id;
  }, [["finetune-model", model, 0, "Base model"], ["finetune-data", data, 1, "Dataset folder"],
    ["finetune-iters", iters, 2, "Iterations"], ["finetune-rank", rank, 2, "LoRA rank"]]);
}

function quantize(main) {
  const model = text("", { placeholder: "org/name or a folder" });
  const info = h("p", { class: "muted small" });
  const mode = select([["bits", "uniform bits"], ["bpw", "bits-per-weight target (mixed)"],
    ["gptq", "calibrated: GPTQ (2, 4 or 8 bits)"], ["awq", "calibrated: AWQ"]], "bits");
  const bits = select([[2, "2"], [3, "3"], [4, "4"], [5, "5"], [6, "6"], [8, "8"]], "4");
  const group = select([[32, "32"], [64, "64"], [128, "128"]], "64");
  const bpw = num(4.5, { step: "0.1", min: 1.5, max: 16 });
  const calib = text("", { placeholder: "a .txt or .jsonl file, or a dataset folder" });
  const samples = num(32, { step: "1", min: 1, max: 1024 });
  const calibrated = () => mode.value === "gptq" || mode.value === "awq";
  const sync = () => { calib.disabled = samples.disabled = !calibrated(); bpw.disabled = mode.value !== "bpw"; };
  mode.addEventListener("change", sync);
  sync();
  servedModel().then((m) => { if (!model.value) model.value = m; });
  wizard(main, "Quantize", [
    { name: "Model", view: () => [field("Model to quantize", model), info], check: async () => {
      const r = await api("/api/quantize/inspect", { json: { model_id: model.value.trim() } }).catch((e) => e.body);
      if (!r?.ok) return r?.error || "Not found";
      if (r.quantized) return "That model is already quantized";
      info.textContent = `${r.arch} · ${r.size_gb} GB`;
      return null;
    } },
    { name: "Precision", view: () => [info, field("Mode", mode), field("Bits", bits), field("Target bits per weight", bpw,
      "Used in mixed mode: layers get different widths so the whole model meets the target."), field("Group size", group),
      field("Calibration text", calib, "GPTQ and AWQ fit each layer to text like what the model will read: a text file, "
        + "a .jsonl file or a dataset folder (its train.jsonl)."), field("Calibration sequences", samples)],
      check: () => {
        if (mode.value === "bpw" && !(Number(bpw.value) >= 1.5 && Number(bpw.value) <= 16)) return "Target between 1.5 and 16";
        if (calibrated() && !calib.value.trim()) return "GPTQ and AWQ need calibration text";
        if (mode.value === "gptq" && ![2, 4, 8].includes(Number(bits.value))) return "GPTQ packs 2, 4 or 8 bits";
        return null;
      } },
    { name: "Review", view: () => [h("p", {}, `Quantize ${model.value} to ${mode.value === "bpw" ? `${bpw.value} bits per weight (mixed)`
      : `${bits.value} bits`}, group size ${group.value}${calibrated() ? `, ${mode.value.toUpperCase()} on ${calib.value.trim()}` : ""}.`
      + " The result is a new model in the library.")] },
  ], async () => {
    const body = { model_id: model.value.trim(), group_size: Number(group.value), bits: Number(bits.value) };
    if (mode.value === "bpw") body.target_bpw = Number(bpw.value);
    if (calibrated()) Object.assign(body, { method: mode.value, calibration_data: calib.value.trim(), n_calibration: Number(samples.value) });
    const r = await api("/api/quantize/submit", { json: body });
    toast(`Quantizing into ${r.output_repo}`);
    return r.job_id;
  }, [["quantize-source", model, 0, "Model to quantize"], ["quantize-mode", mode, 1, "Mode"], ["quantize-bits", bits, 1, "Bits"],
    ["quantize-group", group, 1, "Group size"], ["quantize-calibration", calib, 1, "Calibration text"]]);
}

function dataset(main) {
  let templates = [], chosen = null;
  const pick = h("select", { "aria-label": "Template" });
  const about = h("p", { class: "muted" });
  const inputs = {};
  api("/api/dataset/templates").then((r) => {
    templates = r.templates;
    pick.replaceChildren(...templates.map((t) => h("option", { value: t.id }, t.label)));
    describe();
  });
  pick.addEventListener("change", describe);
  function describe() {
    chosen = templates.find((t) => t.id === pick.value) || templates[0];
    about.textContent = chosen ? `${chosen.description}${chosen.needs_llm ? " (uses the served model)" : ""}` : "";
  }
  const fields = () => chosen.fields.map((f) => {
    const key = `${chosen.id}:${f.name}`;
    if (!inputs[key]) {
      inputs[key] = f.type === "textarea" ? h("textarea", { rows: 8, style: "width:100%" })
        : h("input", { type: f.type === "number" ? "number" : "text", step: f.integer ? 1 : "any",
          min: f.minimum ?? false, max: f.maximum ?? false, style: "width:100%" });
      if (f.default !== undefined) inputs[key].value = f.default;
    }
    return field(`${f.label}${f.required ? " *" : ""}`, inputs[key], f.hint);
  });
  wizard(main, "Dataset", [
    { name: "Template", view: () => [field("Template", pick), about], check: () => (chosen ? null : "Pick a template") },
    { name: "Inputs", view: fields, check: () => {
      for (const f of chosen.fields) {
        const v = inputs[`${chosen.id}:${f.name}`]?.value ?? "";
        if (f.required && !v.trim()) return `${f.label} is required`;
        if (f.type === "number" && v !== "" && Number.isNaN(Number(v))) return `${f.label} must be a number`;
      }
      return null;
    } },
    { name: "Review", view: () => [h("p", {}, `Build a ${chosen.output_format} dataset with “${chosen.label}”.`)] },
  ], async () => {
    const values = {};
    for (const f of chosen.fields) {
      const v = inputs[`${chosen.id}:${f.name}`]?.value ?? "";
      if (v !== "") values[f.name] = f.type === "number" ? Number(v) : v;
    }
    const r = await api("/api/dataset/submit", { json: { template_id: chosen.id, inputs: values } });
    toast(`Writing ${r.output_dir}`);
    return r.job_id;
  }, [["dataset-template", pick, 0, "Template"]]);
}

export function wizardPage(main, kind) {
  ({ finetune, quantize, dataset })[kind](main);
}
