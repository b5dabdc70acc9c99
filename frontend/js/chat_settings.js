// The chat's generation settings, in a compact panel under the chat bar: every sampling field the API takes
// (the model's defaults shown where a field is empty), max tokens, stop sequences, logit bias by token text,
// and a response format with a JSON schema editor that checks the schema as it is typed. Saved on the session
// with one `set_sampling` frame; an empty field is sent as null (the server's default).
import { h, toast } from "./util.js";

const NUMBERS = [
  ["temperature", "temperature", 0, 2, 0.05], ["top_p", "top p", 0, 1, 0.01], ["top_k", "top k", 0, null, 1],
  ["min_p", "min p", 0, 1, 0.01], ["repetition_penalty", "repetition penalty", 0, null, 0.01],
  ["repetition_context_size", "repetition window", 0, null, 1], ["presence_penalty", "presence penalty", null, null, 0.1],
  ["presence_context_size", "presence window", 0, null, 1], ["frequency_penalty", "frequency penalty", null, null, 0.1],
  ["frequency_context_size", "frequency window", 0, null, 1], ["seed", "seed", null, null, 1],
  ["max_tokens", "max tokens", 1, null, 1],
];

export function samplingPanel(frame, onSaved) {
  const inputs = Object.fromEntries(NUMBERS.map(([key, label, min, max, step]) => [key, h("input", {
    type: "number", step, min: min ?? false, max: max ?? false, "aria-label": label, "data-key": key })]));
  const stop = h("input", { placeholder: "e.g. ###, END", "aria-label": "Stop sequences (comma separated)" });
  const bias = h("textarea", { rows: 2, placeholder: "one per line: token text = bias (-100 to 100)",
    "aria-label": "Logit bias by token text" });
  const format = h("select", { "aria-label": "Response format" }, h("option", { value: "text" }, "text"),
    h("option", { value: "json_object" }, "any JSON object"), h("option", { value: "json_schema" }, "JSON schema"));
  const schema = h("textarea", { rows: 6, class: "schema", spellcheck: "false", hidden: true,
    "aria-label": "JSON schema", placeholder: '{"type": "object", "properties": {"name": {"type": "string"}}}' });
  const schemaNote = h("p", { class: "small", role: "status" });
  const problem = h("p", { class: "error small", role: "alert", hidden: true });
  const panel = h("form", { class: "card sampling-panel", hidden: true, onsubmit: (e) => { e.preventDefault(); save(); } },
    h("div", { class: "sampling-grid" }, ...NUMBERS.map(([key, label]) => h("label", {}, h("span", {}, label), inputs[key]))),
    h("div", { class: "sampling-grid wide" }, h("label", {}, h("span", {}, "stop"), stop),
      h("label", {}, h("span", {}, "logit bias"), bias),
      h("label", {}, h("span", {}, "response format"), format)),
    schema, schemaNote, problem,
    h("div", { class: "row" }, h("button", { type: "submit", class: "primary small" }, "Save for this chat"),
      h("button", { type: "button", class: "small", onclick: () => { panel.hidden = true; toggle.setAttribute("aria-expanded", "false"); } },
        "Close")));
  const toggle = h("button", { type: "button", "aria-expanded": "false", "aria-label": "Sampling settings",
    onclick: () => { panel.hidden = !panel.hidden; toggle.setAttribute("aria-expanded", String(!panel.hidden)); } }, "Sampling…");
  format.addEventListener("change", () => { schema.hidden = format.value !== "json_schema"; checkSchema(); });
  schema.addEventListener("input", checkSchema);

  function checkSchema() {
    if (format.value !== "json_schema") { schemaNote.textContent = ""; return null; }
    try {
      const parsed = JSON.parse(schema.value || "null");
      if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) throw new Error("a schema is a JSON object");
      schemaNote.className = "small ok-text"; schemaNote.textContent = "Valid JSON schema object.";
      return parsed;
    } catch (e) { schemaNote.className = "error small"; schemaNote.textContent = e.message; return undefined; }
  }

  function parseBias() {
    const out = {};
    for (const line of bias.value.split("\n").map((l) => l.trim()).filter(Boolean)) {
      const at = line.lastIndexOf("=");
      const text = at > 0 ? line.slice(0, at).trim().replace(/^"(.*)"$/, "$1") : "";
      const value = Number(at > 0 ? line.slice(at + 1) : NaN);
      if (!text || !Number.isFinite(value)) throw new Error(`logit bias: “${line}” is not “token text = number”`);
      out[text] = value;
    }
    return Object.keys(out).length ? out : null;
  }

  function save() {
    problem.hidden = true;
    const values = {};
    for (const [key, input] of Object.entries(inputs)) values[key] = input.value === "" ? null : Number(input.value);
    try {
      values.stop = stop.value.trim() ? stop.value.split(",").map((s) => s.trim()).filter(Boolean) : null;
      values.logit_bias = parseBias();
      const parsed = checkSchema();
      if (parsed === undefined) throw new Error("the JSON schema does not parse");
      values.response_format = format.value === "json_schema" ? { type: "json_schema", json_schema: { name: "reply", schema: parsed } }
        : format.value === "json_object" ? { type: "json_object" } : null;
    } catch (e) { problem.textContent = e.message; problem.hidden = false; return; }
    frame({ type: "set_sampling", scope: "session", ...values });
    onSaved?.(values);
    toast("Sampling saved for this chat");
  }

  return {
    toggle, panel,
    // The model's defaults as placeholders (from the ready frame).
    defaults(gen) {
      for (const [key, input] of Object.entries(inputs)) input.placeholder = gen?.[key] != null ? `${gen[key]} (model)` : "default";
    },
    // The session's stored values (from its history frame).
    show(sampling = {}) {
      for (const [key, input] of Object.entries(inputs)) input.value = sampling[key] ?? "";
      stop.value = (sampling.stop || []).join(", ");
      bias.value = Object.entries(sampling.logit_bias || {}).map(([k, v]) => `${k} = ${v}`).join("\n");
      const rf = sampling.response_format;
      format.value = rf?.type || "text";
      schema.hidden = format.value !== "json_schema";
      schema.value = rf?.json_schema ? JSON.stringify(rf.json_schema.schema, null, 2) : "";
      checkSchema();
    },
    error(message) { problem.textContent = message; problem.hidden = false; },
  };
}
