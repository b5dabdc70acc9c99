// "Push to the Hub" for a job's output or an adapter folder: POST /api/{quantize,finetune,dataset}/push with the
// saved token (Settings). The form asks for owner/name and whether the repo is public; the answer links the repo.
import { api, h, toast } from "./util.js";

// kind: quantize | finetune | dataset; source: { job_id } or { source_path }.
export function pushForm(kind, source, label) {
  const box = h("div", { class: "push" });
  const open = h("button", { type: "button", class: "small", "aria-label": `Push ${label} to the Hub`,
    onclick: () => box.replaceChildren(form()) }, "Push to Hub");
  box.append(open);

  function form() {
    const repo = h("input", { placeholder: "owner/name", "aria-label": `Hub repo for ${label}`, required: true,
      pattern: "[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*", autocomplete: "off" });
    const pub = h("input", { type: "checkbox", "aria-label": "Public repo" });
    const send = h("button", { type: "submit", class: "primary small" }, "Push");
    const note = h("span", { class: "muted small", role: "status" });
    const el = h("form", { class: "row push-form", onsubmit: async (e) => {
      e.preventDefault();
      send.disabled = true; note.textContent = "Uploading…";
      try {
        const r = await api(`/api/${kind}/push`, { json: { repo_id: repo.value.trim(), private: !pub.checked, ...source } });
        box.replaceChildren(h("span", { class: "small" }, "Pushed: ", h("a", { href: r.url, target: "_blank", rel: "noopener" }, r.url)));
        toast(`Pushed to ${repo.value.trim()}`);
      } catch (err) { note.textContent = ""; send.disabled = false; toast(err.message); note.textContent = err.message; note.className = "error small"; }
    } }, repo, h("label", { class: "small" }, pub, " public"), send,
    h("button", { type: "button", class: "small", onclick: () => box.replaceChildren(open) }, "Cancel"), note);
    setTimeout(() => repo.focus());
    return el;
  }
  return box;
}
