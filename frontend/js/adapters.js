// LoRA adapters: what is on disk, what is mounted; mount and unmount.
import { api, bytes, h, toast } from "./util.js";

export function adaptersPage(main) {
  const list = h("div", { class: "table-wrap" });
  const id = h("input", { placeholder: "id", "aria-label": "Adapter id", style: "width:10em" });
  const path = h("input", { placeholder: "/path/to/adapter", "aria-label": "Adapter folder", style: "flex:1" });
  main.append(h("div", { class: "page" }, h("h1", {}, "Adapters"),
    h("p", { class: "muted" }, "Mounted adapters can be picked per chat (the adapter menu) or per request (`adapter`)."),
    list, h("h2", {}, "Mount a folder"),
    h("form", { class: "row", onsubmit: async (e) => { e.preventDefault(); await mount(id.value.trim(), path.value.trim()); } },
      id, path, h("button", { class: "primary", type: "submit" }, "Mount"))));

  async function mount(adapterId, folder) {
    try { await api("/v1/adapters", { json: { id: adapterId, path: folder } }); toast(`Mounted ${adapterId}`); load(); }
    catch (e) { toast(e.message); }
  }

  async function load() {
    const [avail, mounted] = await Promise.all([api("/v1/adapters/available"), api("/v1/adapters")]);
    const ram = Object.fromEntries(mounted.adapters.map((a) => [a.id, a]));
    list.replaceChildren(avail.adapters.length ? h("table", {}, h("thead", {}, h("tr", {}, ...["adapter", "rank", "base model",
      "state", ""].map((t) => h("th", {}, t)))), h("tbody", {}, ...avail.adapters.map((a) => h("tr", {},
      h("td", {}, a.id, h("div", { class: "muted small" }, a.path)), h("td", {}, a.rank ?? "–"),
      h("td", { class: "small" }, a.base_model || "–"),
      h("td", {}, a.mounted ? h("span", { class: "badge ok" }, `mounted · ${bytes(ram[a.id]?.ram_bytes)}`) :
        a.compatible ? h("span", { class: "badge" }, "available") : h("span", { class: "badge warn" }, "other base model")),
      h("td", {}, a.mounted ? h("button", { type: "button", onclick: async () => {
        await api(`/v1/adapters/${encodeURIComponent(a.id)}`, { method: "DELETE" }).catch((e) => toast(e.message)); load();
      } }, "Unmount") : h("button", { type: "button", disabled: !a.compatible, onclick: () => mount(a.id, a.path) }, "Mount"))))))
      : h("p", { class: "muted" }, "No adapters yet: train one on the Fine-tune page."));
  }
  load().catch((e) => list.replaceChildren(h("p", { class: "error" }, e.message)));
}
