// Disk clean-up on the Models page: GET /api/gc/plan lists, per model, each revision in the HF cache with what
// the plan does to it and why; removing asks once more, then POST /api/gc/execute deletes exactly what a fresh
// plan lists (never a revision a ref names, one being served, or one holding files no kept revision has).
import { api, bytes, h, toast } from "./util.js";

const ACTION = { keep: ["ok", "keep"], skip: ["warn", "keep (skipped)"], remove: ["bad", "remove"] };

export function cleanupPanel(onRemoved) {
  const body = h("div", { class: "cleanup-body" });
  const find = h("button", { type: "button", onclick: () => plan() }, "Find old revisions");
  const el = h("section", { class: "cleanup", "aria-labelledby": "cleanup-title" },
    h("h2", { id: "cleanup-title" }, "Disk clean-up"),
    h("p", { class: "muted small" }, "Downloading a newer revision of a model leaves the old one in the cache. " +
      "Nothing is removed until you confirm."), h("div", { class: "row" }, find), body);

  async function plan() {
    find.setAttribute("aria-busy", "true");
    body.replaceChildren(h("p", { class: "muted" }, "Reading the cache…"));
    try { render(await api("/api/gc/plan")); }
    catch (e) { body.replaceChildren(h("p", { class: "error" }, e.message)); }
    finally { find.removeAttribute("aria-busy"); }
  }

  function render(r) {
    const repos = r.superseded || [];
    const removable = repos.reduce((n, x) => n + x.prune_snapshots, 0);
    if (!repos.length) {
      body.replaceChildren(h("p", { class: "muted", role: "status" }, "Nothing to clean up: every revision in the cache is in use."));
      return;
    }
    const summary = removable || r.reclaim_bytes
      ? `${removable} old revision${removable === 1 ? "" : "s"} can go, freeing ${bytes(r.reclaim_bytes)}.`
      : "Nothing can be removed: the old revisions below hold files the kept ones lack.";
    body.replaceChildren(h("p", { role: "status" }, summary),
      ...repos.map((repo) => h("div", { class: "card cleanup-repo", "data-repo": repo.repo_id },
        h("div", { class: "row" }, h("strong", {}, repo.repo_id),
          h("span", { class: "muted small" }, repo.reclaim_bytes ? `frees ${bytes(repo.reclaim_bytes)}` : "frees nothing")),
        h("ul", { class: "revisions" }, ...(repo.revisions || []).map((v) => h("li", { "data-action": v.action },
          h("span", { class: `badge ${ACTION[v.action]?.[0] || ""}` }, ACTION[v.action]?.[1] || v.action), " ",
          h("code", { title: v.revision }, v.revision.slice(0, 12)), h("span", { class: "muted small" }, ` ${v.why}`)))))),
      removable || r.reclaim_bytes ? confirmRow(removable, r.reclaim_bytes) : "");
  }

  function confirmRow(count, size) {
    const row = h("div", { class: "row" });
    const ask = h("button", { type: "button", class: "danger", onclick: () => row.replaceChildren(
      h("span", {}, `Delete ${count} revision${count === 1 ? "" : "s"} (${bytes(size)}) for good?`),
      h("button", { type: "button", class: "danger", onclick: () => execute(row) }, "Yes, delete"),
      h("button", { type: "button", onclick: () => row.replaceChildren(ask) }, "Cancel")) },
    `Remove ${count} old revision${count === 1 ? "" : "s"}`);
    row.append(ask);
    return row;
  }

  async function execute(row) {
    row.replaceChildren(h("span", { class: "muted", role: "status" }, "Deleting…"));
    try {
      const done = await api("/api/gc/execute", { json: { yes: true } });
      toast(`Removed ${done.snapshots} revision${done.snapshots === 1 ? "" : "s"}, freed ${bytes(done.reclaimed_bytes)}`);
      onRemoved?.();
      await plan();
    } catch (e) { row.replaceChildren(h("p", { class: "error" }, e.message)); }
  }

  return el;
}
