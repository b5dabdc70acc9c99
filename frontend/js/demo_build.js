// The demo chat model training in the background (`hearth serve --build-demo`, what `make serve` runs):
// the `demo_build` object of /health and /stats, shown on the Status and Models pages.
import { bar, h } from "./util.js";

export function demoBuildCard(d) {
  if (!d) return "";
  const steps = d.steps || 0, step = d.step || 0;
  const served = d.served_step == null ? "not yet" : d.served_step === 0 ? "step 0 (untrained: it babbles)"
    : `step ${d.served_step}${d.served_step === steps ? " (finished)" : ""}`;
  const head = { starting: "Preparing the training data…", training: `Training: step ${step} of ${steps}`,
    done: "Trained: the finished model is served", failed: "Training failed" }[d.state] || d.state;
  const note = d.state === "failed" ? h("p", { class: "error" }, d.error || "the build stopped")
    : d.state === "done" ? ""
    : h("p", { class: "muted small" }, "Served from its first checkpoint (seconds in) and swapped for each "
      + "better one as it trains; a reply may wait a few seconds while new weights load.");
  return h("div", { class: "card notice demo-build", role: "status" },
    h("h2", { style: "margin-top:0" }, `Demo model ${d.model || ""}`),
    h("p", {}, head), d.state === "training" ? bar(steps ? step / steps : 0, "demo model training") : "",
    h("dl", { class: "kv" }, h("dt", {}, "served"), h("dd", {}, served),
      h("dt", {}, "loss"), h("dd", {}, d.loss != null ? d.loss.toFixed(3) : "–"),
      h("dt", {}, "time"), h("dd", {}, d.seconds != null ? `${Math.round(d.seconds)} s` : "–")), note);
}
