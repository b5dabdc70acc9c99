// The chat's generation settings, in a compact panel under the chat bar: every sampling field the API takes
// (the model's defaults shown where a field is empty), max tokens, stop sequences, logit bias by token text,
// and a response format with a JSON schema editor that checks the schema as it is typed. Saved on the session
// with one `set_sampling` frame; an empty field is sent as null (the server's default).
// The number fields are the server's list (`GET /api/sampling-fields`: name, type, range, what each does),
// read once per page.
import { api, h, toast } from "./util.js";

let asked = null;

// The numbers `set_sampling` takes, in the server's order; asked again after a failure.
export function samplingFields() {
  asked ??= api("/api/sampling-fields").then((r) => r.fields).catch((e) => { asked = null; throw e; });
  return asked;
}

function numberInput(field) {
  const label = field.name.replaceAll("_", " ");
  const input = h("input", { type: "number", step: field.type === "integer" ? 1 : 0.01, min: field.minimum ?? false,
    max: field.maximum ?? false, "aria-label": label, "data-key": field.name, title: field.description });
  return [input, h("label", { title: field.description }, h("span", {}, label), input)];
}

export function samplingPanel(frame, onSaved) {
  const inputs = {};
  const grid = h("div", { class: "sampling-grid" });
  let modelDefaults = null, stored = null;  // shown once the fields are drawn
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
    grid,
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
  samplingFields().then((fields) => {
    for (const field of fields) {
      const [input, label] = numberInput(field);
      inputs[field.name] = input;
      grid.append(label);
    }
    placeholders();
    showNumbers();
  }).catch((e) => error(`The sampling fields did not load: ${e.message}`));

  function placeholders() {
    for (const [key, input] of Object.entries(inputs)) {
      input.placeholder = modelDefaults?.[key] != null ? `${modelDefaults[key]} (model)` : "default";
    }
  }

  function showNumbers() {
    for (const [key, input] of Object.entries(inputs)) input.value = stored?.[key] ?? "";
  }

  function error(message) { problem.textContent = message; problem.hidden = false; }

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
    } catch (e) { error(e.message); return; }
    frame({ type: "set_sampling", scope: "session", ...values });
    onSaved?.(values);
    toast("Sampling saved for this chat");
  }

  return {
    toggle, panel,
    // The model's defaults as placeholders (from the ready frame).
    defaults(gen) { modelDefaults = gen; placeholders(); },
    // The session's stored values (from its history frame).
    show(sampling = {}) {
      stored = sampling;
      showNumbers();
      stop.value = (sampling.stop || []).join(", ");
      bias.value = Object.entries(sampling.logit_bias || {}).map(([k, v]) => `${k} = ${v}`).join("\n");
      const rf = sampling.response_format;
      format.value = rf?.type || "text";
      schema.hidden = format.value !== "json_schema";
      schema.value = rf?.json_schema ? JSON.stringify(rf.json_schema.schema, null, 2) : "";
      checkSchema();
    },
    error,
  };
}
