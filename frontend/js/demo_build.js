// The demo models training in the background (`hearth serve --build-demo`, what `make serve` runs): the
// `demo_build` (chat) and `speech_build` objects of /health and /stats, shown on the Status and Models pages.
import { bar, h } from "./util.js";

function card(title, d, head, rows, note) {
  const steps = d.steps || 0, step = d.step || 0;
  return h("div", { class: "card notice demo-build", role: "status" },
    h("h2", { style: "margin-top:0" }, `${title} ${d.model || ""}`),
    h("p", {}, head), d.state === "training" ? bar(steps ? step / steps : 0, `${title} training`) : "",
    h("dl", { class: "kv" }, ...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]),
      h("dt", {}, "loss"), h("dd", {}, d.loss != null ? d.loss.toFixed(3) : "–"),
      h("dt", {}, "time"), h("dd", {}, d.seconds != null ? `${Math.round(d.seconds)} s` : "–")),
    d.state === "failed" ? h("p", { class: "error" }, d.error || "the build stopped") : d.state === "done" ? ""
      : h("p", { class: "muted small" }, note));
}

// What both cards say of a build's steps, and of a build cut short that this one went on from.
function progress(d) {
  const resumed = d.resumed_from == null ? "" : ` (resumed from step ${d.resumed_from})`;
  return `step ${d.step || 0} of ${d.steps || 0}${resumed}`;
}

function stopped(d) {
  return `Stopped at step ${d.step || 0} of ${d.steps || 0}: the next start goes on from there`;
}

function resumedRow(d) {
  return d.resumed_from == null ? []
    : [["resumed", `from step ${d.resumed_from}, where a build cut short saved its training state`]];
}

function demoBuildCard(d) {
  if (!d) return "";
  const steps = d.steps || 0;
  const served = d.served_step == null ? "not yet" : d.served_step === 0 ? "step 0 (untrained: it babbles)"
    : `step ${d.served_step}${d.served_step === steps ? " (finished)" : ""}`;
  const head = { starting: "Preparing the training data…", training: `Training: ${progress(d)}`,
    done: "Trained: the finished model is served", failed: "Training failed", stopped: stopped(d) }[d.state] || d.state;
  return card("Demo model", d, head, [["served", served], ...resumedRow(d)],
    "Served from its first checkpoint (seconds in) and swapped for each better one as it trains; "
    + "a reply may wait a few seconds while new weights load.");
}

function speechBuildCard(d) {
  if (!d) return "";
  const head = { waiting: "Waiting for the demo chat model to finish training", starting: "Preparing the training data…",
    training: `Training: ${progress(d)}`,
    "handing over": "Trained: the default model's process starts again with it",
    done: "Trained: transcription is offered",
    failed: "Training failed", stopped: stopped(d) }[d.state] || d.state;
  return card("Demo speech model", d, head, resumedRow(d),
    "Transcription (/v1/audio/*, audio parts in chat) is offered once it is built; "
    + "until then /v1/audio/* answers a 503 that says so. It hears spoken digits only.");
}

export function demoBuildCards(s) {
  return [demoBuildCard(s.demo_build), speechBuildCard(s.speech_build)];
}
