// LoRA adapters: what is on disk, what is mounted; mount and unmount, merge two into one, export a manifest for
// another tool, push one to the Hub.
import { pushForm } from "./push.js";
import { api, bytes, h, toast } from "./util.js";

export function adaptersPage(main) {
  const list = h("div", { class: "table-wrap" });
  const id = h("input", { placeholder: "id", "aria-label": "Adapter id", style: "width:10em" });
  const path = h("input", { placeholder: "/path/to/adapter", "aria-label": "Adapter folder", style: "flex:1" });
  const merge = h("div");
  main.append(h("div", { class: "page adapters" }, h("h1", {}, "Adapters"),
    h("p", { class: "muted" }, "Mounted adapters can be picked per chat (the adapter menu) or per request (the ",
      h("code", {}, "adapter"), " field)."),
    list, h("h2", {}, "Mount a folder"),
    h("form", { class: "row", onsubmit: async (e) => { e.preventDefault(); await mount(id.value.trim(), path.value.trim()); } },
      id, path, h("button", { class: "primary", type: "submit" }, "Mount")),
    h("h2", {}, "Merge two adapters"), merge));

  async function mount(adapterId, folder) {
    try { await api("/v1/adapters", { json: { id: adapterId, path: folder } }); toast(`Mounted ${adapterId}`); load(); }
    catch (e) { toast(e.message); }
  }

  async function exportOne(a, cell) {
    try {
      const base = a.base_model || (await api("/v1/models")).data?.[0]?.id;
      const r = await api("/api/finetune/export", { json: { base_model: base, adapter_path: a.path } });
      cell.replaceChildren(h("span", { class: "small" }, "Exported: ", h("code", {}, r.export_path)));
    } catch (e) { toast(e.message); }
  }

  function row(a, ram) {
    const exported = h("div", { class: "exported" });
    return h("tr", { "data-adapter": a.id },
      h("td", { "data-label": "adapter" }, a.id, a.partial ? partialBadge(a.partial) : "", h("div", { class: "muted small" }, a.path),
        exported),
      h("td", { "data-label": "rank" }, a.rank ?? "–"),
      h("td", { class: "small", "data-label": "base model", title: a.base_model }, a.base_model_name || "–"),
      h("td", { "data-label": "state" }, a.mounted ? h("span", { class: "badge ok" }, `mounted · ${bytes(ram[a.id]?.ram_bytes)}`) :
        a.compatible ? h("span", { class: "badge" }, "available") : h("span", { class: "badge warn" }, "other base model")),
      h("td", { class: "actions", "data-label": "" }, h("div", { class: "acts" }, a.mounted ? h("button", { type: "button", onclick: async () => {
        await api(`/v1/adapters/${encodeURIComponent(a.id)}`, { method: "DELETE" }).catch((e) => toast(e.message)); load();
      } }, "Unmount") : h("button", { type: "button", disabled: !a.compatible, onclick: () => mount(a.id, a.path) }, "Mount"),
      h("button", { type: "button", class: "small", "aria-label": `Export ${a.id}`, onclick: () => exportOne(a, exported) },
        "Export"),
      pushForm("finetune", { source_path: a.path }, a.id))));
  }

  // A fine-tune that ended before its last step (cancelled, failed, or its worker died) leaves its last whole checkpoint.
  function partialBadge(p) {
    const at = p.step == null ? "" : ` · step ${p.step}${p.iters ? ` of ${p.iters}` : ""}`;
    return h("span", { class: "badge warn", title: `Its fine-tune ended ${p.ended} before its last step; this is its last checkpoint` },
      `partial${at}`);
  }

  function mergeForm(adapters) {
    if (adapters.length < 2) return h("p", { class: "muted small" }, "Two adapters of one base model merge into one that acts as both stacked.");
    const pick = (label, i) => h("select", { "aria-label": label }, ...adapters.map((a, j) =>
      h("option", { value: a.path, selected: i === j }, a.id)));
    const a = pick("First adapter", 0), b = pick("Second adapter", 1);
    const sa = h("input", { type: "number", step: "0.1", placeholder: "own scale", "aria-label": "First adapter's scale", style: "width:7em" });
    const sb = h("input", { type: "number", step: "0.1", placeholder: "own scale", "aria-label": "Second adapter's scale", style: "width:7em" });
    const note = h("p", { class: "small", role: "status" });
    return h("form", { class: "card merge", onsubmit: async (e) => {
      e.preventDefault();
      if (a.value === b.value) { note.className = "error small"; note.textContent = "Pick two different adapters."; return; }
      const scales = sa.value || sb.value ? [Number(sa.value || 1), Number(sb.value || 1)] : undefined;
      note.className = "muted small"; note.textContent = "Merging…";
      try {
        const r = await api("/api/finetune/merge", { json: { adapter_a: a.value, adapter_b: b.value, scales } });
        note.className = "small"; note.replaceChildren("Merged into ", h("code", {}, r.merged_path),
          ` (${r.stats.layers_merged} layers merged, scales ${r.stats.scales.join(" and ")})`);
        load({ keepMerge: true });
      } catch (err) { note.className = "error small"; note.textContent = err.message; }
    } }, h("div", { class: "row" }, a, sa, h("span", {}, "+"), b, sb, h("button", { class: "primary", type: "submit" }, "Merge")),
    h("p", { class: "muted small" }, "Scales default to each adapter's own. The result is a new adapter in HEARTH_HOME/adapters."), note);
  }

  async function load({ keepMerge = false } = {}) {
    const [avail, mounted] = await Promise.all([api("/v1/adapters/available"), api("/v1/adapters")]);
    const ram = Object.fromEntries(mounted.adapters.map((a) => [a.id, a]));
    list.replaceChildren(avail.adapters.length ? h("table", { class: "library" }, h("thead", {}, h("tr", {}, ...["adapter", "rank",
      "base model", "state", ""].map((t) => h("th", {}, t)))), h("tbody", {}, ...avail.adapters.map((a) => row(a, ram))))
      : h("p", { class: "muted" }, "No adapters yet: train one on the Fine-tune page."));
    if (!keepMerge) merge.replaceChildren(mergeForm(avail.adapters));
  }
  load().catch((e) => list.replaceChildren(h("p", { class: "error" }, e.message)));
}
