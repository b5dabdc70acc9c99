// The chat sidebar's per-session actions (fork, export, delete) and importing a session from a file. Fork and
// delete are chat socket frames; export downloads /api/sessions/export as JSONL; import posts the file to
// /api/sessions/import and opens the new session.
import { api, h, toast } from "./util.js";

export function sessionMenu(s, frame) {
  const menu = h("div", { class: "session-menu", hidden: true, role: "group", "aria-label": `Actions for ${s.title}` });
  const toggle = h("button", { type: "button", class: "session-more", "aria-label": `More for ${s.title}`,
    "aria-expanded": "false", title: "Fork, export or delete", onclick: (e) => {
      e.stopPropagation();
      menu.hidden = !menu.hidden;
      toggle.setAttribute("aria-expanded", String(!menu.hidden));
      if (!menu.hidden) menu.replaceChildren(...actions());
    } }, "⋯");

  function actions() {
    return [
      h("button", { type: "button", onclick: () => frame({ type: "fork_session", path: s.path }) }, "Fork"),
      h("a", { href: `/api/sessions/export?path=${encodeURIComponent(s.path)}&format=jsonl`, download: `${slug(s.title)}.jsonl`,
        role: "button", class: "button" }, "Export"),
      h("button", { type: "button", class: "danger", onclick: () => menu.replaceChildren(
        h("span", { class: "small" }, "Delete this chat?"),
        h("button", { type: "button", class: "danger", onclick: () => frame({ type: "delete_session", path: s.path }) }, "Delete"),
        h("button", { type: "button", onclick: () => menu.replaceChildren(...actions()) }, "Keep")) }, "Delete…"),
    ];
  }
  return [toggle, menu];
}

export function importButton(frame) {
  const file = h("input", { type: "file", accept: ".jsonl,.json,application/json", hidden: true,
    "aria-label": "Session file to import", onchange: async () => {
      const picked = file.files?.[0];
      file.value = "";
      if (!picked) return;
      const text = await picked.text();
      const jsonl = picked.name.endsWith(".jsonl") || !text.trimStart().startsWith("{\"entries\"");
      try {
        const r = await api("/api/sessions/import", { method: "POST", body: text,
          headers: { "content-type": jsonl ? "application/x-ndjson" : "application/json" } });
        toast(`Imported “${r.title}” (${r.message_count} messages)`);
        frame({ type: "open_session", path: r.path });
        frame({ type: "list_sessions" });
      } catch (e) { toast(`Import failed: ${e.message}`); }
    } });
  return h("div", { class: "session-import" }, file,
    h("button", { type: "button", class: "small", onclick: () => file.click() }, "Import a chat…"));
}

function slug(title) {
  return (title || "chat").toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "").slice(0, 40) || "chat";
}
