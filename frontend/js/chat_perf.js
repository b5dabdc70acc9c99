// A stored turn's perf strip, from its meta (the turn_end frame's fields): time to the first token the turn
// generated, its decode rate, the lane, prompt tokens read from the cache, and whether it was stopped.
// The rate is `tokens_per_s` = `decode_tokens` / `decode_ms`: every generation of the turn (tool rounds
// included) counts its tokens after the first, over the time from its first token to its last, so prefill,
// tool runs, approvals and text held back from view count for nothing (chat/live.py `_meta`).
import { h } from "./util.js";

export function perfStrip(meta) {
  if (!meta || meta.ttft_ms === undefined) return null;
  const parts = [`TTFT ${meta.ttft_ms} ms`];
  if (meta.tokens_per_s) parts.push(`${meta.tokens_per_s} tok/s`);
  if (meta.lane) parts.push(meta.lane);
  if (meta.cached_tokens) parts.push(`${meta.cached_tokens} cached`);
  if (meta.aborted) parts.push("stopped");
  const title = meta.decode_ms ? `${meta.decode_tokens} tokens decoded in ${meta.decode_ms} ms, from each `
    + "generation's first token to its last (prefill, tool runs and approvals not counted)" : null;
  return h("span", { class: "perf", title }, parts.join(" · "));
}
