// Memory: the vault of markdown articles synthesis writes from chat sessions.
// `#/memory` is status, search and the article list; `#/memory/<Article>?a=<anchor>`
// is one article with its infobox, contents, links and git history.
import { api, bar, h, toast } from "./util.js";
import { markdown } from "./md.js";

const STAGES = ["ingest", "segment", "extract", "route", "create", "section-route", "patch", "link", "wikify"];
const VAULT_KEY = "hearth-memory-vault";

// Kept across route changes: the last search, and a synthesis run in progress.
const saved = { q: "", scope: "all" };
let run = null; // { jobId, dry, state: {stage: "current"|"done"|"failed"}, progress, logs, status, error, source }
const listeners = new Set();

const vaultName = () => localStorage.getItem(VAULT_KEY) || "";
const withVault = (path) => {
  const v = vaultName();
  return v ? `${path}${path.includes("?") ? "&" : "?"}vault=${encodeURIComponent(v)}` : path;
};
// A GET that hands back the body of an `ok: false` answer instead of throwing on it.
async function get(path) {
  try { return await api(withVault(path)); } catch (e) { if (e.body) return e.body; throw e; }
}
export const articleHref = (name, anchor, line) => {
  const q = new URLSearchParams();
  if (anchor) q.set("a", anchor);
  if (line) q.set("l", line);
  return `#/memory/${encodeURIComponent(name)}${q.toString() ? `?${q}` : ""}`;
};

export function memoryPage(main, rest) {
  const joined = rest.join("/");
  const cut = joined.indexOf("?");
  const name = decode(cut < 0 ? joined : joined.slice(0, cut));
  const params = new URLSearchParams(cut < 0 ? "" : joined.slice(cut + 1));
  const page = h("div", { class: "page memory" });
  main.append(page);
  const off = [];
  if (name) articleView(page, name, params.get("a"), Number(params.get("l")) || 0, off);
  else homeView(page, off);
  return () => off.forEach((f) => f());
}

function decode(s) {
  try { return decodeURIComponent(s); } catch { return s; }
}

// ---- home: consent card, status, synthesis, search, list ------------------------------------

async function homeView(page, off) {
  const title = h("h1", {}, "Memory");
  page.append(title, h("p", { class: "muted" }, "Loading the vault…"));
  let vaults = [];
  try { vaults = (await get("/api/memory/vaults")).vaults || []; } catch { vaults = []; }
  if (vaults.length && !vaults.some((v) => v.name === vaultName())) {
    const pick = vaults.find((v) => v.default) || vaults[0];
    localStorage.setItem(VAULT_KEY, pick.name);
  }
  if (!vaults.length) localStorage.removeItem(VAULT_KEY);
  let status;
  try { status = await get("/api/memory/status"); } catch (e) {
    page.replaceChildren(title, h("p", { class: "error", role: "alert" }, `The memory API did not answer: ${e.message}`));
    return;
  }
  if (!status.ok || status.enabled === false) { consent(page, title, status, off); return; }

  const vault = vaults.find((v) => v.name === vaultName());
  const head = h("div", { class: "mem-head" }, title);
  if (vaults.length > 1) {
    const select = h("select", { "aria-label": "Vault", onchange: () => {
      localStorage.setItem(VAULT_KEY, select.value); off.splice(0).forEach((f) => f());
      page.replaceChildren(); homeView(page, off);
    } }, ...vaults.map((v) => h("option", { value: v.name }, v.default ? `${v.name} (default)` : v.name)));
    select.value = vaultName();
    head.append(select);
  }
  const statusLine = h("p", { class: "mem-status small muted", "aria-live": "polite" });
  const synth = synthPanel(() => refresh());
  off.push(synth.stop);
  const q = h("input", { type: "search", placeholder: "Search the vault", "aria-label": "Search memory",
    autocomplete: "off" });
  const scope = h("select", { "aria-label": "Search scope" }, h("option", { value: "all" }, "Everything"),
    h("option", { value: "articles" }, "Articles"), h("option", { value: "reference" }, "Reference"));
  q.value = saved.q; scope.value = saved.scope;
  const results = h("div", { class: "mem-results", "aria-live": "polite" });
  const form = h("form", { class: "row mem-search", role: "search", onsubmit: (e) => { e.preventDefault(); search(); } },
    q, scope, h("button", { type: "submit" }, "Search"));
  page.replaceChildren(head, statusLine, demoWarning(status.synthesis_model), synth.el, form, results);

  let timer = 0, seq = 0, list = null;
  q.addEventListener("input", () => { saved.q = q.value; clearTimeout(timer); timer = setTimeout(search, 300); });
  scope.addEventListener("change", () => search());
  off.push(() => clearTimeout(timer));

  async function refresh() {
    const [s, l, vs] = await Promise.all([get("/api/memory/status"), get("/api/memory/list"),
      get("/api/memory/vaults").catch(() => ({}))]);
    const v = s.vault || (vs.vaults || vaults).find((x) => x.name === vaultName()) || vault;
    showStatus(statusLine, s.status || {}, v, status.root);
    list = l.ok ? l : { articles: [], reference: [] };
    if (!q.value.trim()) showList();
  }
  function showList() {
    const arts = list?.articles || [], refs = list?.reference || [];
    results.replaceChildren(
      h("h2", {}, `Articles `, h("span", { class: "muted small" }, String(arts.length))),
      arts.length ? h("ul", { class: "mem-list" }, ...arts.map((a) => h("li", {}, h("a", { href: articleHref(a) }, a))))
        : h("p", { class: "muted" }, "No articles yet. Synthesis writes them from your chat sessions."),
      refs.length ? h("h2", {}, "Reference ", h("span", { class: "muted small" }, String(refs.length))) : "",
      refs.length ? h("ul", { class: "mem-list" }, ...refs.map((a) => h("li", {}, h("a", { href: articleHref(a) },
        a.replace(/^Reference\//, ""))))) : "");
  }
  async function search() {
    clearTimeout(timer);
    saved.q = q.value; saved.scope = scope.value;
    const text = q.value.trim();
    const mine = ++seq;
    if (!text) { if (list) showList(); return; }
    results.replaceChildren(h("p", { class: "muted" }, "Searching…"));
    let r;
    try { r = await get(`/api/memory/search?q=${encodeURIComponent(text)}&scope=${scope.value}&limit=50`); }
    catch (e) { r = { ok: false, error: e.message }; }
    if (mine !== seq) return;
    if (!r.ok) { results.replaceChildren(h("p", { class: "error", role: "alert" }, r.error || "Search failed")); return; }
    showResults(results, r);
  }
  await refresh().catch((e) => statusLine.replaceChildren(h("span", { class: "error" }, e.message)));
  if (q.value.trim()) search();
}

function showStatus(el, s, vault, root) {
  const when = vault?.last_synthesized_at;
  el.replaceChildren(
    h("strong", {}, `${s.article_count ?? 0} articles`), h("span", {}, `${s.reference_count ?? 0} reference docs`),
    s.is_git_repo ? h("span", { class: "badge ok" }, "git") : h("span", { class: "badge warn" }, "no git"),
    h("span", {}, `last synthesized ${when ? new Date(when).toLocaleString() : "never"}`),
    h("code", { class: "mem-root" }, s.root || vault?.root || root || ""));
}

function consent(page, title, status, off) {
  const error = h("p", { class: "error", role: "alert" });
  const path = h("input", { type: "text", id: "mem-path", placeholder: status.root || "", autocomplete: "off" });
  const name = h("input", { type: "text", id: "mem-name", placeholder: "default", autocomplete: "off" });
  const create = h("button", { class: "primary", type: "button", onclick: async () => {
    create.disabled = true; error.textContent = "";
    const body = {};
    if (path.value.trim()) body.path = path.value.trim();
    if (name.value.trim()) body.name = name.value.trim();
    try {
      const r = await api("/api/memory/init", { json: body });
      const made = r.vault?.name || body.name;
      if (made) localStorage.setItem(VAULT_KEY, made); else localStorage.removeItem(VAULT_KEY);
      toast(r.result?.already_set_up ? "The vault was already set up" : `Vault created at ${r.result?.root || r.status?.root}`);
      page.replaceChildren(); homeView(page, off);
    } catch (e) { error.textContent = e.message; create.disabled = false; }
  } }, "Create vault");
  page.replaceChildren(title, h("section", { class: "card mem-consent", "aria-labelledby": "mem-consent-h" },
    h("h2", { id: "mem-consent-h" }, "Set up a memory vault"),
    h("p", {}, "A vault is a git repository of markdown articles, one per person, project or topic. ",
      "Synthesis reads your chat sessions and writes or updates those articles; chat tools can then read them ",
      "when answering. Nothing leaves this machine, and every change is a git commit you can inspect or undo."),
    h("p", {}, "It will live in ", h("code", {}, status.root || "the default folder"), "."),
    h("details", {}, h("summary", {}, "Another folder or name"),
      h("label", { for: "mem-path" }, "Folder"), path,
      h("div", { class: "hint" }, "Under the default root or the system temp folder."),
      h("label", { for: "mem-name" }, "Name"), name),
    status.reason && status.reason !== "no memory vault yet" ? h("p", { class: "error" }, status.reason) : "",
    h("div", { class: "row" }, create), error));
}

// Search results: per-article summaries, then line hits with highlighted excerpts.
function showResults(el, r) {
  const sums = r.summaries || [], hits = r.hits || [];
  if (!sums.length && !hits.length) { el.replaceChildren(h("p", { class: "muted" }, "Nothing matches.")); return; }
  el.replaceChildren(
    h("p", { class: "muted small" }, `${hits.length} hits in ${sums.length} articles`, r.mode ? ` · ${r.mode}` : ""),
    h("ul", { class: "mem-summaries" }, ...sums.map((s) => h("li", {},
      h("a", { href: articleHref(s.article) }, s.article),
      h("span", { class: "muted small" }, ` ${s.occurrences} × `, (s.matched_terms || []).join(", "))))),
    h("ol", { class: "mem-hits" }, ...hits.map((hit) => h("li", {},
      h("a", { href: articleHref(hit.article, hit.anchor, hit.line) },
        h("span", { class: "mem-hit-where" }, hit.article, hit.anchor ? ` › ${hit.anchor}` : "", ` · line ${hit.line}`),
        h("span", { class: "mem-excerpt" }, ...highlight(hit.excerpt || "", hit.ranges || [])))))));
}

// Marks the ranges (code-point offsets) of `text` with <mark>, as text nodes only.
export function highlight(text, ranges) {
  const chars = Array.from(text);
  const spans = ranges.map(([a, b]) => [Math.max(0, a), Math.min(chars.length, b)]).filter(([a, b]) => b > a)
    .sort((x, y) => x[0] - y[0]);
  const out = [];
  let at = 0;
  for (const [a, b] of spans) {
    if (a < at) continue; // overlapping: the first wins
    if (a > at) out.push(chars.slice(at, a).join(""));
    out.push(h("mark", {}, chars.slice(a, b).join("")));
    at = b;
  }
  if (at < chars.length) out.push(chars.slice(at).join(""));
  return out;
}

// The demo models can show that synthesis works, not write articles worth keeping: say so before a run.
const REAL_MODEL = "mlx-community/Qwen3-1.7B-4bit";

function demoWarning(model) {
  if (!model?.demo) return "";
  const get = h("button", { type: "button", onclick: async () => {
    try { await api("/api/hub/download", { json: { repo: REAL_MODEL } }); toast(`Downloading ${REAL_MODEL}`); location.hash = "#/models"; }
    catch (e) { toast(e.message); }
  } }, `Download ${REAL_MODEL} (about 1 GB)`);
  return h("div", { class: "card notice mem-demo", role: "note" },
    h("strong", {}, "Synthesis needs a real model. "),
    `The model being served, ${model.model}, is Hearth's tiny demo: it can chat a little, but the articles it writes ` +
    "would be nonsense. Download a small real model, then serve it (Models page) and synthesize with it.",
    h("div", { class: "row" }, get, h("a", { href: "#/models" }, "Open Models")));
}

// ---- synthesis: start, follow the job's SSE, show stages ------------------------------------

function synthPanel(onDone) {
  const start = h("button", { class: "primary", type: "button", onclick: () => begin(false) }, "Synthesize");
  const dry = h("button", { type: "button", onclick: () => begin(true) }, "Dry run");
  const box = h("div", { class: "mem-run" });
  const el = h("div", { class: "mem-synth" }, h("div", { class: "row" }, start, dry,
    h("span", { class: "hint" }, "Synthesis turns chat sessions into articles; a dry run only plans the stages.")), box);
  const draw = () => {
    const busy = run && (run.status === "starting" || run.status === "running");
    start.disabled = dry.disabled = !!busy;
    start.setAttribute("aria-busy", busy ? "true" : "false");
    box.replaceChildren(run ? runView(run) : "");
  };
  const listener = (finished) => { draw(); if (finished) onDone(); };
  listeners.add(listener);
  draw();
  if (!run) attachRunning();
  async function begin(isDry) {
    run = { jobId: null, dry: isDry, state: {}, progress: 0, logs: [], status: "starting", error: "" };
    notify();
    try {
      const r = await api("/api/memory/synthesize", { json: { vault: vaultName() || undefined, dry: isDry } });
      follow(r.job_id);
    } catch (e) { run.status = "failed"; run.error = e.message; notify(true); }
  }
  return { el, stop: () => listeners.delete(listener) };
}

// A run started before this page was opened (or before a reload) is followed again.
async function attachRunning() {
  try {
    const r = await api("/api/jobs?limit=20");
    const job = (r.jobs || []).find((j) => /memory|synth/i.test(j.kind) && (j.status === "queued" || j.status === "running"));
    if (job && !run) {
      run = { jobId: job.id, dry: false, state: {}, progress: job.progress || 0, logs: [], status: "running", error: "" };
      follow(job.id);
    }
  } catch { /* no jobs API: nothing to reattach */ }
}

function notify(finished = false) { for (const f of listeners) f(finished); }

function follow(jobId) {
  const r = run;
  r.jobId = jobId; r.status = "running";
  notify();
  const source = new EventSource(`/api/jobs/${encodeURIComponent(jobId)}/stream`);
  r.source = source;
  const finish = (status, error) => {
    if (r.status !== "running") return;
    r.status = status; if (error) r.error = error;
    if (status === "done") { // stages the run never reached (nothing to do) are shown as skipped
      for (const s of STAGES) r.state[s] = r.state[s] === "current" || r.state[s] === "done" ? "done" : "skipped";
      r.progress = 1;
    }
    if (status === "failed") {
      const cur = STAGES.find((s) => r.state[s] === "current");
      if (cur) r.state[cur] = "failed";
    }
    source.close();
    if (r === run) notify(true);
  };
  source.onmessage = (e) => {
    let ev;
    try { ev = JSON.parse(e.data); } catch { return; }
    if (ev.type === "stage" && ev.stage) {
      const i = STAGES.indexOf(ev.stage);
      for (const [j, s] of STAGES.entries()) {
        if (i >= 0 && j < i && r.state[s] !== "failed") r.state[s] = "done";
      }
      if (r.state[ev.stage] !== "done") r.state[ev.stage] = ev.status === "done" ? "done" : "current";
      if (ev.message) r.logs.push(`${ev.stage}: ${ev.message}`);
      if (typeof ev.progress === "number") r.progress = ev.progress;
      else if (i >= 0) r.progress = Math.max(r.progress, i / STAGES.length);
    } else if (ev.type === "log") {
      r.logs.push(ev.line ?? ev.message ?? "");
    } else if (ev.type === "progress" && typeof ev.progress === "number") {
      r.progress = ev.progress;
    } else if (ev.type === "done") {
      if (ev.message || ev.note) r.logs.push(ev.message || ev.note);
      finish("done");
    } else if (ev.type === "failed" || ev.type === "error") {
      finish("failed", ev.error || ev.message || "synthesis failed");
    }
    if (r.logs.length > 300) r.logs.splice(0, r.logs.length - 300);
    if (r === run && r.status === "running") notify();
  };
  source.addEventListener("end", () => {
    source.close();
    if (r.status !== "running") return;
    // The stream ended without a done/failed event: ask the job how it ended.
    api(`/api/jobs/${encodeURIComponent(jobId)}`).then(({ job }) => finish(job.status === "done" ? "done" : "failed",
      job.error || (job.status === "done" ? "" : `the job ended ${job.status}`)))
      .catch((e) => finish("failed", e.message));
  });
}

function runView(r) {
  const label = { starting: "Starting…", running: "Running", done: "Done", failed: "Failed" }[r.status];
  const log = h("div", { class: "events mem-log", tabindex: 0, "aria-label": "Synthesis log" }, r.logs.join("\n"));
  queueMicrotask(() => { log.scrollTop = log.scrollHeight; });
  return h("section", { class: "card", "aria-label": "Synthesis progress" },
    h("div", { class: "row" }, h("strong", {}, r.dry ? "Dry run" : "Synthesis"),
      h("span", { class: `badge ${r.status === "done" ? "ok" : r.status === "failed" ? "bad" : ""}` }, label),
      r.jobId ? h("a", { class: "small", href: `#/jobs/${encodeURIComponent(r.jobId)}` }, `job ${r.jobId}`) : ""),
    h("ol", { class: "mem-stages" }, ...STAGES.map((s) => {
      const st = r.state[s] || "pending";
      return h("li", { class: st, "aria-current": st === "current" ? "step" : null },
        h("span", { class: "mem-dot", "aria-hidden": "true" }, { done: "✓", current: "●", failed: "✕", skipped: "–" }[st] || "○"),
        h("span", {}, s), h("span", { class: "visually-hidden" }, ` (${st})`));
    })),
    bar(r.progress, "synthesis progress"),
    r.error ? h("p", { class: "error", role: "alert" }, r.error) : "",
    r.logs.length ? log : "");
}

// ---- one article ------------------------------------------------------------------------------

async function articleView(page, name, anchor, line, off) {
  const back = h("p", { class: "mem-back" }, h("a", { href: "#/memory" }, "‹ Memory"));
  page.append(back, h("p", { class: "muted" }, "Loading…"));
  let a, list;
  try {
    [a, list] = await Promise.all([get(`/api/memory/article?name=${encodeURIComponent(name)}`), get("/api/memory/list")]);
  } catch (e) { page.replaceChildren(back, h("p", { class: "error", role: "alert" }, e.message)); return; }
  if (!a.ok) {
    page.replaceChildren(back, h("h1", {}, name), h("p", { class: a.enabled === false ? "muted" : "error" },
      a.enabled === false ? "There is no memory vault yet." : `No article named “${name}” in this vault.`),
      h("p", {}, h("a", { href: "#/memory" }, a.enabled === false ? "Set one up" : "Search the vault")));
    return;
  }
  const known = new Map([...(list.articles || []), ...(list.reference || [])].map((n) => [n.toLowerCase(), n]));
  const body = wikiMarkdown(stripFrontMatter(a.content || ""), known);
  if (!body.querySelector("h1")) body.prepend(h("h1", {}, a.name || name));
  const toc = tagHeadings(body, a.structure || []);

  const aside = h("aside", { class: "mem-aside" });
  if (a.infobox) aside.append(infobox(a.infobox, a.name || name));
  if (toc.length > 1) {
    aside.append(h("nav", { class: "card mem-toc", "aria-label": "Contents" }, h("h2", {}, "Contents"),
      h("ol", {}, ...toc.map(({ entry, el }) => h("li", { class: `lvl${Math.min(entry.level, 6)}` },
        h("a", { href: articleHref(a.name || name, entry.anchor), onclick: (e) => {
          e.preventDefault(); jump(el); history.replaceState(null, "", articleHref(a.name || name, entry.anchor));
        } }, entry.title))))));
  }
  const links = h("section", { class: "card mem-links", "aria-label": "Links" }, h("h2", {}, "Links"),
    h("p", { class: "muted small" }, "Loading…"));
  aside.append(links);
  const hist = h("section", { class: "mem-history" }, h("h2", {}, "History"), h("p", { class: "muted small" }, "Loading…"));
  page.replaceChildren(back, a.series ? series(a.series) : "",
    h("div", { class: "mem-article" }, aside, h("article", { class: "mem-body" }, body)), hist);

  const target = anchor ? toc.find((t) => t.entry.anchor === anchor)?.el : null;
  const byLine = !target && line ? [...toc].reverse().find((t) => t.entry.line <= line)?.el : null;
  if (target || byLine) requestAnimationFrame(() => jump(target || byLine));
  document.title = `Hearth · ${a.name || name}`;

  get(`/api/memory/links?name=${encodeURIComponent(name)}`).then((l) => {
    if (!l.ok) { links.replaceChildren(h("h2", {}, "Links"), h("p", { class: "muted small" }, l.error || "No links.")); return; }
    const group = (title, names) => [h("h3", {}, title, " ", h("span", { class: "muted small" }, String(names.length))),
      names.length ? h("ul", {}, ...names.map((n) => h("li", {}, h("a", {
        href: articleHref(known.get(n.toLowerCase()) || n), class: known.has(n.toLowerCase()) ? "" : "missing" }, n))))
        : h("p", { class: "muted small" }, "None.")];
    links.replaceChildren(h("h2", {}, "Links"), ...group("Links to", l.outbound || []),
      ...group("Linked from", l.inbound || []));
  }).catch((e) => links.replaceChildren(h("h2", {}, "Links"), h("p", { class: "error small" }, e.message)));

  get(`/api/memory/history?name=${encodeURIComponent(name)}&limit=50`).then((r) => {
    const entries = r.entries || [];
    if (!r.ok || !entries.length) {
      hist.replaceChildren(h("h2", {}, "History"), h("p", { class: "muted small" },
        r.ok ? (r.is_git_repo === false ? "The vault is not a git repository." : "No commits yet.") : r.error || "No history."));
      return;
    }
    hist.replaceChildren(h("h2", {}, "History"), h("ul", { class: "mem-commits" }, ...entries.map((c) => {
      const out = h("div", { class: "mem-diff-box" });
      const d = h("details", {}, h("summary", {}, h("code", {}, (c.hash || "").slice(0, 8)), " ",
        h("span", { class: "muted" }, c.date || ""), " ", c.subject || ""), out);
      d.addEventListener("toggle", async () => {
        if (!d.open || out.dataset.loaded) return;
        out.dataset.loaded = "1";
        out.replaceChildren(h("p", { class: "muted small" }, "Loading diff…"));
        try {
          const r2 = await get(`/api/memory/diff?name=${encodeURIComponent(name)}&rev=${encodeURIComponent(c.hash)}`);
          if (!r2.ok) throw new Error(r2.error || "no diff for this commit");
          out.replaceChildren(diffView(r2.diff || ""));
        } catch (e) { delete out.dataset.loaded; out.replaceChildren(h("p", { class: "error small" }, e.message)); }
      });
      return h("li", {}, d);
    })));
  }).catch((e) => hist.replaceChildren(h("h2", {}, "History"), h("p", { class: "error small" }, e.message)));
}

function jump(el) {
  el.scrollIntoView({ block: "start" });
  el.classList.add("mem-target");
  setTimeout(() => el.classList.remove("mem-target"), 2000);
}

// Markdown with [[Target]] / [[Target|label]] / [[Target#Section|label]] as in-app links. The
// wikilinks are swapped for inert placeholders before marked runs (md.js keeps its escaping),
// then the placeholders in the rendered text become <a> elements built from text nodes.
export function wikiMarkdown(text, known) {
  const links = [];
  const src = text.replace(/\[\[([^\[\]\n]+?)\]\]/g, (raw, inner) => {
    links.push({ raw, inner });
    return `\uE000${links.length - 1}\uE001`;
  });
  const div = markdown(src);
  const walker = document.createTreeWalker(div, NodeFilter.SHOW_TEXT);
  const nodes = [];
  while (walker.nextNode()) if (walker.currentNode.nodeValue.includes("\uE000")) nodes.push(walker.currentNode);
  for (const node of nodes) {
    const inCode = !!node.parentElement.closest("code, pre");
    const parts = node.nodeValue.split(/\uE000(\d+)\uE001/);
    const frag = document.createDocumentFragment();
    parts.forEach((part, i) => {
      if (i % 2 === 0) { if (part) frag.append(part); return; }
      const link = links[Number(part)];
      if (!link) return;
      if (inCode) { frag.append(link.raw); return; }
      const [targetPart, label] = splitOnce(link.inner, "|");
      const [target, section] = splitOnce(targetPart.trim(), "#");
      const canonical = known.get(target.toLowerCase());
      frag.append(h("a", { href: articleHref(canonical || target, section ? slug(section) : ""),
        class: canonical ? "wikilink" : "wikilink missing",
        title: canonical ? canonical : `${target} (no article yet)` }, (label ?? targetPart).trim() || target));
    });
    node.replaceWith(frag);
  }
  return div;
}

function splitOnce(s, sep) {
  const i = s.indexOf(sep);
  return i < 0 ? [s, undefined] : [s.slice(0, i), s.slice(i + 1)];
}
// The vault's anchor rule (memory/vault.py slug): casefold, drop punctuation, runs of space/_ become "-".
const slug = (s) => s.toLowerCase().replace(/[^\p{L}\p{M}\p{N}_\s-]/gu, "").trim().replace(/[\s_]+/g, "-") || "section";

// Front matter (the infobox's source) is not part of the rendered article.
function stripFrontMatter(text) {
  const lines = text.split("\n");
  if (lines[0]?.trim() !== "---") return text;
  for (let end = 1; end < Math.min(lines.length, 200); end++) {
    if (lines[end].trim() === "---") return lines.slice(end + 1).join("\n");
  }
  return text;
}

// Gives the rendered headings their structure anchors (in order, level by level) and returns them.
function tagHeadings(body, structure) {
  const heads = [...body.querySelectorAll("h1, h2, h3, h4, h5, h6")];
  const out = [];
  let at = 0;
  for (const entry of structure) {
    let i = at;
    while (i < heads.length && Number(heads[i].tagName[1]) !== Number(entry.level)) i++;
    if (i >= heads.length) continue;
    heads[i].dataset.anchor = entry.anchor;
    heads[i].id = `mem-${entry.anchor}`;
    heads[i].tabIndex = -1;
    out.push({ entry, el: heads[i] });
    at = i + 1;
  }
  return out;
}

function infobox(box, name) {
  const kind = [box.type, box.entity_kind].filter(Boolean).join(" · ");
  return h("section", { class: "card mem-infobox", "aria-label": "Infobox" },
    h("div", { class: "mem-infobox-head" }, h("strong", {}, name), kind ? h("span", { class: "muted small" }, kind) : ""),
    (box.fields || []).length ? h("table", {}, h("tbody", {}, ...box.fields.map((f) => h("tr", {},
      h("th", { scope: "row" }, f.key), h("td", {}, ...inlineWiki(String(f.value ?? ""))))))) : "");
}

// Infobox values are plain text that may carry wikilinks.
function inlineWiki(text) {
  const out = [];
  let at = 0;
  for (const m of text.matchAll(/\[\[([^\[\]\n]+?)\]\]/g)) {
    if (m.index > at) out.push(text.slice(at, m.index));
    const [t, label] = splitOnce(m[1], "|");
    out.push(h("a", { href: articleHref(splitOnce(t.trim(), "#")[0]), class: "wikilink" }, (label ?? t).trim()));
    at = m.index + m[0].length;
  }
  if (at < text.length) out.push(text.slice(at));
  return out;
}

function series(s) {
  const title = typeof s === "string" ? s : s.title || s.name || String(s);
  return h("div", { class: "mem-series", role: "note" }, "Part of the series ", h("strong", {}, title));
}

// A unified diff as text lines, + and - coloured by class only.
function diffView(diff) {
  const pre = h("pre", { class: "mem-diff", tabindex: 0, "aria-label": "Diff" });
  for (const lineText of diff.replace(/\n$/, "").split("\n")) {
    const cls = lineText.startsWith("+++") || lineText.startsWith("---") || lineText.startsWith("diff ")
      || lineText.startsWith("index ") ? "meta" : lineText.startsWith("@@") ? "hunk"
      : lineText.startsWith("+") ? "add" : lineText.startsWith("-") ? "del" : "";
    pre.append(h("span", { class: cls }, lineText || " "), "\n");
  }
  return pre;
}
