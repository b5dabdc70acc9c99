// Settings: the MCP servers whose tools the chat offers (GET/PUT /api/settings/mcp). The configuration is the
// JSON other MCP clients use, so one can be pasted in; secret values come back masked and stay as stored when
// sent back masked. Saving lists each server's tools at once and shows which started and why one did not.
import { api, h, toast } from "./util.js";

const EXAMPLE = { mcpServers: { files: { command: "npx", args: ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"] } } };

export function mcpCard() {
  const text = h("textarea", { class: "mcp-config", rows: 8, spellcheck: "false", "aria-label": "MCP servers (JSON)" });
  const problem = h("p", { class: "error small", role: "alert", hidden: true });
  const list = h("ul", { class: "mcp-status", "aria-live": "polite" });
  const where = h("span", { class: "muted small" });
  const save = h("button", { class: "primary", type: "submit" }, "Save and connect");
  const card = h("div", { class: "card mcp" }, h("h2", { style: "margin-top:0" }, "MCP servers"),
    h("p", { class: "muted small" }, "Tools of MCP servers are offered to the chat as server__tool, and each call asks " +
      "for approval like the coding tools. A server with \"command\" runs on this machine over stdio; one with " +
      "\"url\" is reached over streamable HTTP."),
    h("form", { onsubmit: (e) => { e.preventDefault(); store(); } }, text, problem,
      h("div", { class: "row" }, save, where)), list);

  function show(r) {
    text.value = JSON.stringify({ mcpServers: r.servers }, null, 2);
    where.textContent = `kept in ${r.path}`;
    const names = Object.keys(r.servers);
    list.replaceChildren(...(names.length ? names.map((name) => {
      const s = r.status[name];
      return h("li", { "data-server": name }, h("strong", {}, name), " ",
        !s ? h("span", { class: "badge" }, "not listed yet")
          : s.error ? h("span", { class: "badge bad", title: s.error }, "not available")
            : h("span", { class: "badge ok" }, `${s.tools.length} tool${s.tools.length === 1 ? "" : "s"}`),
        s?.error ? h("div", { class: "error small" }, s.error)
          : h("div", { class: "muted small" }, (s?.tools || []).map((t) => `${name}__${t}`).join(", ")));
    }) : [h("li", { class: "muted small" }, "None configured. Example: " + JSON.stringify(EXAMPLE))]));
  }

  async function store() {
    problem.hidden = true;
    let body;
    try { body = JSON.parse(text.value || "{}"); }
    catch (e) { problem.textContent = `Not JSON: ${e.message}`; problem.hidden = false; return; }
    save.setAttribute("aria-busy", "true");
    const servers = body?.mcpServers ?? body?.servers ?? {};  // the file's shape, as other MCP clients write it
    try { show(await api("/api/settings/mcp", { method: "PUT", json: { servers } })); toast("MCP servers saved"); }
    catch (e) { problem.textContent = e.message; problem.hidden = false; }
    finally { save.removeAttribute("aria-busy"); }
  }

  api("/api/settings/mcp").then(show).catch((e) => { problem.textContent = e.message; problem.hidden = false; });
  return card;
}
