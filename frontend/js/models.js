// The local library with fit badges, hub search and downloads with progress.
import { api, bar, bytes, every, fitBadge, h, toast } from "./util.js";

export function modelsPage(main) {
  const library = h("div", { class: "table-wrap" }, h("p", { class: "muted" }, "Reading the cache…"));
  const downloads = h("div");
  const results = h("div");
  const q = h("input", { type: "search", placeholder: "Search the Hugging Face Hub (MLX models)", style: "flex:1",
    "aria-label": "Search models" });
  main.append(h("div", { class: "page" }, h("h1", {}, "Models"),
    h("form", { class: "row", onsubmit: (e) => { e.preventDefault(); search(); } }, q, h("button", { type: "submit" }, "Search")),
    results, h("h2", {}, "Downloads"), downloads, h("h2", {}, "On this machine"), library));

  async function search() {
    if (!q.value.trim()) return;
    results.replaceChildren(h("p", { class: "muted" }, "Searching…"));
    try {
      const r = await api(`/api/hub/search?q=${encodeURIComponent(q.value.trim())}`);
      if (r.offline) { results.replaceChildren(h("p", { class: "error" }, `The hub is unreachable: ${r.error}`)); return; }
      results.replaceChildren(h("div", { class: "table-wrap" }, h("table", {}, h("tbody", {}, ...r.results.map((m) =>
        h("tr", {}, h("td", {}, m.id), h("td", { class: "muted small" }, `${m.downloads} downloads · ${m.likes} likes`),
          h("td", {}, h("button", { type: "button", onclick: () => download(m.id) }, "Download"))))))));
      if (!r.results.length) results.replaceChildren(h("p", { class: "muted" }, "No MLX models match."));
    } catch (e) { results.replaceChildren(h("p", { class: "error" }, e.message)); }
  }

  async function download(repo) {
    try { await api("/api/hub/download", { json: { repo } }); toast(`Downloading ${repo}`); }
    catch (e) { toast(e.message); }
  }

  async function loadLibrary(refresh) {
    const r = await api(`/library${refresh ? "?refresh=1" : ""}`);
    library.replaceChildren(h("table", {}, h("thead", {}, h("tr", {}, ...["model", "type", "size", "quant", "fit", ""]
      .map((t) => h("th", {}, t)))), h("tbody", {}, ...r.models.map((m) => h("tr", {},
      h("td", {}, m.repo_id, m.serving ? h("span", { class: "badge ok", style: "margin-left:6px" }, "serving") : ""),
      h("td", {}, m.model_type || "–", m.supported ? "" : h("span", { class: "badge warn" }, " unsupported")),
      h("td", {}, bytes(m.size_bytes)), h("td", {}, m.quant_bits ? `${m.quant_bits}-bit` : "full"),
      h("td", {}, fitBadge(m.assessment)),
      h("td", {}, m.serving ? "" : h("button", { type: "button", class: "small", onclick: async () => {
        const s = await api("/api/hub/serve", { method: "POST", json: { model: m.repo_id } }).catch((e) => e.body);
        toast(s?.command ? `Restart with: ${s.command}` : "Could not switch");
      } }, "Serve")))))));
  }

  let seenDone = new Set();
  const stop = every(1000, async () => {
    const r = await api("/downloads");
    downloads.replaceChildren(...(r.downloads.length ? r.downloads.map((d) => h("div", { class: "card" },
      h("div", { class: "row" }, h("strong", {}, d.repo_id), h("span", { class: `badge ${d.state === "done" ? "ok" :
        d.state === "error" ? "bad" : ""}` }, d.state),
        h("span", { class: "muted small" }, `${bytes(d.received_bytes)} / ${bytes(d.total_bytes)} · files ${d.files_done}/${d.files_total}`
          + (d.state === "active" ? ` · ${bytes(d.bytes_per_sec)}/s` : ""))),
      bar(d.total_bytes ? d.received_bytes / d.total_bytes : 0, `${d.repo_id} download`),
      d.current_file ? h("div", { class: "muted small" }, d.current_file) : "",
      d.error ? h("div", { class: "error small" }, d.error) : "")) : [h("p", { class: "muted" }, "No downloads yet.")]));
    const done = r.downloads.filter((d) => d.state === "done").map((d) => d.repo_id + d.finished_at);
    if (done.some((k) => !seenDone.has(k))) { seenDone = new Set(done); loadLibrary(false).catch(() => {}); }
  });
  loadLibrary(false).catch((e) => library.replaceChildren(h("p", { class: "error" }, e.message)));
  return stop;
}
