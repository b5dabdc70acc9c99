// Settings: Hearth's API keys (read only: they are set where the server starts), the Hugging Face token, a link
// to the Curve Designer, MCP servers, and each chat's always-allowed tools.
import { mcpCard } from "./mcp.js";
import { api, h, toast } from "./util.js";

const code = (text) => h("code", {}, text);

// Whether this server needs a key, from /api/settings/api-keys, and how keys are set and sent (docs/serving/security.md).
function keysCard() {
  const state = h("p", {}, "…");
  api("/api/settings/api-keys").then((k) => {
    state.textContent = k.required ? "This server needs an API key: every client sends one, and this dashboard signed in with one."
      : k.insecure_no_auth ? "This server needs no key although it listens beyond this machine (--insecure-no-auth): anyone who can reach it can use it."
        : "No key is needed here: Hearth listens on this machine's loopback address, so only programs on this machine can reach it.";
  }).catch((e) => { state.textContent = e.message; });
  return h("div", { class: "card", "data-spot": "settings-keys" }, h("h2", { style: "margin-top:0" }, "API keys"), state,
    h("p", { class: "muted small" }, "Keys are set where the server starts, not here: ", code("hearth serve --api-key KEY"), ", ",
      code("--api-key-file FILE"), " (one key a line) or ", code("HEARTH_API_KEY=KEY"), "; restart the server to change them. Make one with ",
      code("python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"), "."),
    h("p", { class: "muted small" }, "Clients send it as ", code("Authorization: Bearer KEY"), " (the OpenAI SDK's ", code("api_key"),
      ") or ", code("x-api-key: KEY"), " (the Anthropic SDK's ", code("api_key"), "); the dashboard asks for it once, on its sign-in page."));
}

export function settingsPage(main) {
  const tokenState = h("span", { class: "muted" });
  const token = h("input", { type: "password", autocomplete: "off", placeholder: "hf_…", "aria-label": "Hugging Face token",
    style: "flex:1" });
  const approvals = h("div");
  main.append(h("div", { class: "page" }, h("h1", {}, "Settings"), keysCard(),
    h("div", { class: "card", "data-spot": "settings-token" }, h("h2", { style: "margin-top:0" }, "Hugging Face token"),
      h("p", { class: "muted small" }, "Used to push models, adapters and datasets. Kept in HEARTH_HOME/hf.json, readable only by you."),
      h("p", {}, tokenState),
      h("form", { class: "row", onsubmit: async (e) => { e.preventDefault();
        try { await api("/api/settings/hf-token", { json: { token: token.value } }); token.value = ""; toast("Token saved"); load(); }
        catch (err) { toast(err.message); } } }, token, h("button", { class: "primary", type: "submit" }, "Save")),
      h("button", { type: "button", style: "margin-top:8px", onclick: async () => {
        await api("/api/settings/hf-token", { method: "DELETE" }); toast("Token removed"); load(); } }, "Remove token")),
    h("div", { class: "card" }, h("h2", { style: "margin-top:0" }, "Sampling lab"),
      h("p", { class: "muted small" }, "Draw a tone curve over the served model's next-token log-probabilities and compare samples drawn with it against the model's default sampling."),
      h("a", { href: "/curves", class: "curves-link" }, "Open the Curve Designer")),
    mcpCard(),
    h("div", { class: "card" }, h("h2", { style: "margin-top:0" }, "Always-allowed tools"),
      h("p", { class: "muted small" }, "“Always allow” holds for one tool in one chat; every other chat still asks. Revoke to be asked again."),
      approvals)));
  async function load() {
    const t = await api("/api/settings/hf-token");
    tokenState.textContent = t.has_token ? "A token is saved." : "No token saved.";
    const a = await api("/api/settings/tool-approvals");
    const revoke = async (sessionId, tool) => {
      try { await api("/api/settings/tool-approvals", { method: "DELETE", json: { session_id: sessionId, tool } }); toast(`${tool} will ask again`); }
      catch (err) { toast(err.message); }
      load().catch((e) => toast(e.message));
    };
    approvals.replaceChildren(a.sessions.length ? h("ul", { class: "approvals-list" }, ...a.sessions.map((s) => h("li", {},
      h("span", { class: "title" }, s.title), h("span", { class: "muted small" }, s.session_id),
      h("span", { class: "allowed" }, ...s.always_allow.map((tool) => h("span", { class: "badge" }, tool,
        h("button", { type: "button", class: "revoke", title: `Ask again before ${tool} runs in “${s.title}”`,
          "aria-label": `Revoke ${tool} in ${s.title}`, onclick: () => revoke(s.session_id, tool) }, "×")))))))
      : h("p", { class: "muted small" }, "None. Approving a tool with “Always allow” in a chat adds it here, for that chat."));
  }
  load().catch((e) => toast(e.message));
}
