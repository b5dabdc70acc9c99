// Settings: the Hugging Face token and remembered tool approvals.
import { api, h, toast } from "./util.js";

export function settingsPage(main) {
  const tokenState = h("span", { class: "muted" });
  const token = h("input", { type: "password", autocomplete: "off", placeholder: "hf_…", "aria-label": "Hugging Face token",
    style: "flex:1" });
  const approvals = h("div");
  main.append(h("div", { class: "page" }, h("h1", {}, "Settings"),
    h("div", { class: "card" }, h("h2", { style: "margin-top:0" }, "Hugging Face token"),
      h("p", { class: "muted small" }, "Used to push models, adapters and datasets. Kept in HEARTH_HOME/hf.json, readable only by you."),
      h("p", {}, tokenState),
      h("form", { class: "row", onsubmit: async (e) => { e.preventDefault();
        try { await api("/api/settings/hf-token", { json: { token: token.value } }); token.value = ""; toast("Token saved"); load(); }
        catch (err) { toast(err.message); } } }, token, h("button", { class: "primary", type: "submit" }, "Save")),
      h("button", { type: "button", style: "margin-top:8px", onclick: async () => {
        await api("/api/settings/hf-token", { method: "DELETE" }); toast("Token removed"); load(); } }, "Remove token")),
    h("div", { class: "card" }, h("h2", { style: "margin-top:0" }, "Always-allowed tools"), approvals)));
  async function load() {
    const t = await api("/api/settings/hf-token");
    tokenState.textContent = t.hasToken ? "A token is saved." : "No token saved.";
    const a = await api("/api/settings/tool-approvals");
    approvals.replaceChildren(a.alwaysAllow.length ? h("ul", {}, ...a.alwaysAllow.map((name) => h("li", { class: "row" }, name,
      h("button", { type: "button", class: "small", onclick: async () => {
        await api("/api/settings/tool-approvals", { method: "DELETE", json: { tool: name } }); load(); } }, "Forget"))))
      : h("p", { class: "muted small" }, "None. Approving a tool with “always allow” in the chat adds it here."));
  }
  load().catch((e) => toast(e.message));
}
