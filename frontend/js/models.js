// The local library with fit badges, hub search and downloads with progress. GET /models says the mode:
// in router mode each row shows its model's live status (from /models/sse) with load, unload, pin and
// default; in single mode the served model's row shows its status and the others offer a restart to serve them.
import { cleanupPanel } from "./cleanup.js";
import { demoBuildCards } from "./demo_build.js";
import { api, bar, bytes, every, fitBadge, h, toast } from "./util.js";

const BADGE = { loaded: "ok", loading: "warn", failed: "bad" };

export function modelsPage(main) {
  const library = h("div", { class: "table-wrap" }, h("p", { class: "muted" }, "Reading the cache…"));
  const fleetLine = h("p", { class: "muted small fleet-line", hidden: true });
  const demo = h("div");
  const downloads = h("div");
  const results = h("div");
  const q = h("input", { type: "search", placeholder: "Search the Hugging Face Hub (MLX models)", style: "flex:1",
    "aria-label": "Search models", "data-spot": "models-search" });
  main.append(h("div", { class: "page" }, h("h1", {}, "Models"),
    h("form", { class: "row", onsubmit: (e) => { e.preventDefault(); search(); } }, q, h("button", { type: "submit" }, "Search")),
    results, h("h2", {}, "Downloads"), downloads, h("h2", {}, "On this machine"), demo, fleetLine, library,
    cleanupPanel(() => loadLibrary(true).catch(() => {}))));

  // fleet: what GET /models and its event stream say; views: the table row of each model id.
  const fleet = { mode: null, default: null, max: null, rows: new Map(), busy: new Set(), source: null };
  const views = new Map();
  let libraryRows = null;  // null until /library answers
  let stopped = false;

  async function search() {
    if (!q.value.trim()) return;
    results.replaceChildren(h("p", { class: "muted" }, "Searching…"));
    try {
      const r = await api(`/api/hub/search?q=${encodeURIComponent(q.value.trim())}`);
      if (r.offline) { results.replaceChildren(h("p", { class: "error" }, r.error), failureDetail(r.detail)); return; }
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

  async function loadFleet() {
    try {
      const m = await api("/models");
      fleet.mode = m.mode; fleet.default = m.default; fleet.max = m.models_max;
      // With the stream open its rows are newer than this answer: take only models it has not named yet.
      const streamed = fleet.source ? fleet.rows : new Map();
      fleet.rows = new Map((m.data || []).map((d) => [d.id, streamed.get(d.id) || d]));
    } catch { fleet.mode = null; fleet.rows = new Map(); }  // a server without /models: the library alone
    if (fleet.mode === "router" && !fleet.source && !stopped) openStream();
  }

  async function loadLibrary(refresh) {
    const [r] = await Promise.all([api(`/library${refresh ? "?refresh=1" : ""}`), loadFleet()]);
    libraryRows = r.models;
    renderLibrary();
  }

  function renderLibrary() {
    if (stopped || !libraryRows) return;
    views.clear();
    const known = new Set(libraryRows.map((m) => m.repo_id));
    const rows = [...libraryRows.map((m) => [m.repo_id, m]),
      ...[...fleet.rows.keys()].filter((id) => !known.has(id)).map((id) => [id, null])];  // e.g. from --models-dir
    const heads = ["model", ...(fleet.mode ? ["status"] : []), "type", "size", "quant", "fit", ""];
    library.replaceChildren(rows.length ? h("table", { class: "library" },
      h("thead", {}, h("tr", {}, ...heads.map((t) => h("th", {}, t)))),
      h("tbody", {}, ...rows.map(([id, m]) => libraryRow(id, m))))
      : h("p", { class: "muted" }, "No models yet: search the hub above, or run `hearth make-demo-model`."));
    paintFleetLine();
  }

  // One model's row: the cells that change (markers, status, actions) are kept and repainted in place,
  // so a focused button keeps its focus while events arrive.
  function libraryRow(id, m) {
    const f = fleet.rows.get(id);
    const view = {
      markers: h("span", { class: "markers" }),
      badge: h("span", { class: "badge", "aria-live": "polite" }),
      progress: bar(0, `${id} load progress`),
      detail: h("div", { class: "small muted status-detail" }),
      actions: h("td", { class: "actions", "data-label": "" }),
    };
    view.progress.hidden = true;
    view.serving = !!m?.serving;
    const size = m?.size_bytes ?? f?.size_bytes, quant = m ? m.quant_bits : f?.quant_bits;
    view.tr = h("tr", { "data-model": id },
      h("td", { class: "model-cell" }, h("span", { class: "model-id" }, id), view.markers,
        m?.serving && fleet.mode !== "router" ? h("span", { class: "badge ok", style: "margin-left:6px" }, "serving") : null,
        f?.aliases?.length ? h("div", { class: "muted small" }, `also ${f.aliases.join(", ")}`) : null),
      fleet.mode ? h("td", { class: "status-cell", "data-label": "status" }, view.badge, view.progress, view.detail) : null,
      h("td", { "data-label": "type" }, m?.model_type || "–",
        m && !m.supported ? h("span", { class: "badge warn" }, " unsupported") : ""),
      h("td", { class: "nowrap", "data-label": "size" }, bytes(size)),
      h("td", { class: "nowrap", "data-label": "quant" }, quant ? `${quant}-bit` : m || quant === null ? "full" : "–"),
      h("td", { "data-label": "fit" }, m ? fitBadge(m.assessment) : fitFlag(f?.fits)),
      view.actions);
    if (fleet.mode === "router" && f) view.buttons = routerButtons(id);
    else if (m && !m.serving && fleet.mode !== "router") view.actions.append(serveButton(id));
    if (view.buttons) view.actions.append(...Object.values(view.buttons));
    views.set(id, view);
    paintRow(id);
    return view.tr;
  }

  function fitFlag(fits) {
    if (fits === true) return h("span", { class: "badge ok" }, "fits");
    if (fits === false) return h("span", { class: "badge bad" }, "does not fit");
    return h("span", { class: "badge" }, "unknown");
  }

  function serveButton(id) {
    return h("button", { type: "button", class: "small", "aria-label": `Serve ${id}`, onclick: async () => {
      const s = await api("/api/hub/serve", { method: "POST", json: { model: id } }).catch((e) => e.body);
      const live = s?.router_command ? ` (or \`${s.router_command}\` to switch models live)` : "";
      toast(s?.command ? `Restart with: ${s.command}${live}` : "Could not switch");
    } }, "Serve");
  }

  // aria-disabled rather than disabled: a button that waits keeps the keyboard focus it had.
  function off(button, on) { button.setAttribute("aria-disabled", on ? "true" : "false"); }
  const live = (fn) => (e) => { if (e.currentTarget.getAttribute("aria-disabled") !== "true") fn(); };

  function routerButtons(id) {
    const row = () => fleet.rows.get(id) || {};
    return {
      load: h("button", { type: "button", class: "small", onclick: live(() => {
        const s = row().status || {};
        if (s.value === "loaded") act(id, "/models/unload", { model: id }, (r) => setStatus(id, r.status));
        else act(id, "/models/load", { model: id }, (r) => setStatus(id, r.status));
      }) }),
      pin: h("button", { type: "button", class: "small", onclick: live(() =>
        act(id, "/models/pin", { model: id, pinned: !row().pinned }, (r) => { row().pinned = r.pinned; })) }),
      makeDefault: h("button", { type: "button", class: "small", onclick: live(() =>
        act(id, "/models/default", { model: id }, (r) => setDefault(r.default || id))) }, "Make default"),
    };
  }

  // A POST on one model: its buttons wait for the answer; a refusal shows the server's message.
  async function act(id, path, body, done) {
    fleet.busy.add(id); paintRow(id);
    try { done(await api(path, { json: body })); }
    catch (e) { toast(e.message); }
    finally { fleet.busy.delete(id); paintRow(id); paintFleetLine(); }
  }

  function setStatus(id, status) {
    const row = fleet.rows.get(id);
    if (row && status) { row.status = status; if (status.value !== "loading") delete row.progress; }
  }

  function setDefault(id) {
    fleet.default = id;
    for (const [rid, row] of fleet.rows) { row.default = rid === id; paintRow(rid); }
  }

  function paintRow(id) {
    const view = views.get(id);
    if (!view || stopped) return;
    const f = fleet.rows.get(id);
    const s = f?.status || (view.serving && fleet.mode === "single" ? { value: "loaded" } : {});
    // One model's server has nothing to choose between: the markers are router mode's.
    const isDefault = f && fleet.mode === "router" ? (f.default ?? fleet.default === id) : false;
    const pinned = f?.pinned && fleet.mode === "router";
    view.markers.replaceChildren(...[isDefault ? h("span", { class: "badge accent" }, "default") : null,
      pinned ? h("span", { class: "badge", title: "Pinned: kept loaded, never unloaded to make room" }, "pinned") : null]
      .filter(Boolean));
    paintStatus(view, f, s);
    view.tr.setAttribute("aria-busy", fleet.busy.has(id) ? "true" : "false");
    const b = view.buttons;
    if (!b) return;
    const busy = fleet.busy.has(id);
    const loaded = s.value === "loaded";
    const label = s.unloading ? "Unloading…" : s.value === "loading" ? "Loading…" : loaded ? "Unload" : "Load";
    b.load.textContent = label;
    b.load.setAttribute("aria-label", `${label.replace("…", "")} ${id}`);
    off(b.load, busy || !!s.unloading || s.value === "loading");
    b.pin.textContent = f.pinned ? "Unpin" : "Pin";
    b.pin.setAttribute("aria-label", `${f.pinned ? "Unpin" : "Pin"} ${id}`);
    off(b.pin, busy);
    b.makeDefault.hidden = isDefault;
    b.makeDefault.setAttribute("aria-label", `Make ${id} the default model`);
    off(b.makeDefault, busy);
  }

  function paintStatus(view, f, s) {
    if (!fleet.mode) return;
    // Single mode lists the served model alone; a library row without a status shows a dash.
    const value = s.unloading ? "unloading" : s.value || (fleet.mode === "single" && !f ? null : "unknown");
    view.badge.hidden = !value;
    view.badge.className = `badge ${s.unloading ? "warn" : BADGE[value] || ""}`;
    view.badge.textContent = value || "";
    view.badge.title = s.error ? (value === "failed" ? s.error : `last failure: ${s.error}`) : "";
    view.progress.hidden = value !== "loading";
    if (value === "loading") {
      const pct = Math.max(0, Math.min(100, Number(f?.progress?.percent ?? s.percent) || 0));
      view.progress.firstChild.style.width = `${pct}%`;
      view.progress.setAttribute("aria-valuenow", Math.round(pct));
    }
    view.detail.className = `small status-detail ${value === "failed" ? "error" : "muted"}`;
    view.detail.textContent = !value ? "–" : detailText(value, f, s);
  }

  function detailText(value, f = {}, s = {}) {
    // (inflight is left out: a row is sent when the status changes, not when a request ends)
    if (value === "loaded" && f.remote) return `on ${f.remote.node ? "web node" : "host"} ${f.remote.url}`;
    if (value === "loaded") return f.memory_bytes != null ? `memory ${bytes(f.memory_bytes)}` : "";
    // Another web node (same Redis) has it loaded: requests here are passed to it.
    if (value === "unloaded" && f.served_by) return `served by web node ${f.served_by.url}`;
    if (value === "loading") {
      const p = f.progress || {};
      const d = p.download;
      const pct = p.percent ?? s.percent;
      return [p.stage || s.stage || "starting", pct != null ? `${Math.round(pct)}%` : null, p.message,
        d?.total_bytes ? `${bytes(d.received_bytes)} / ${bytes(d.total_bytes)}` : null].filter(Boolean).join(" · ");
    }
    if (value === "failed") return [s.error || "failed to load", s.exit_code != null ? `exit ${s.exit_code}` : null]
      .filter(Boolean).join(" · ");
    if (value === "unloaded" && f?.estimated_bytes) return `needs ~${bytes(f.estimated_bytes)}`;
    return "";
  }

  function paintFleetLine() {
    fleetLine.hidden = fleet.mode !== "router";
    if (fleet.mode !== "router") return;
    const loaded = [...fleet.rows.values()].filter((r) => r.status?.value === "loaded").length;
    fleetLine.textContent = `Router: ${loaded} of ${fleet.rows.size} loaded` +
      (fleet.max ? ` · at most ${fleet.max} at once` : "") + (fleet.default ? ` · default ${fleet.default}` : "");
  }

  // Live status: a `model` event is a model's whole row; `progress` events move its bar while it loads.
  // EventSource reconnects on its own, and the server starts each connection with every model's row.
  function openStream() {
    const source = new EventSource("/models/sse");
    fleet.source = source;
    const read = (e) => { try { return JSON.parse(e.data); } catch { return null; } };
    source.addEventListener("model", (e) => {
      const row = read(e);
      if (!row?.id) return;
      const before = fleet.rows.get(row.id);
      if (before?.progress && row.status?.value === "loading") row.progress = before.progress;
      fleet.rows.set(row.id, row);
      if (row.default) setDefault(row.id);
      if (views.get(row.id)?.buttons) paintRow(row.id); else renderLibrary();  // a model new to the table
      paintFleetLine();
    });
    source.addEventListener("progress", (e) => {
      const p = read(e);
      const row = p && fleet.rows.get(p.model);
      // The load's last frames ("ready", "failed") come just before the model event that ends it.
      if (!row || row.status?.value === "loaded" || p.stage === "ready" || p.stage === "failed") return;
      row.status = { ...(row.status || {}), value: "loading", stage: p.stage ?? row.status?.stage,
        percent: p.percent ?? row.status?.percent };
      row.progress = p;
      paintRow(p.model);
    });
  }

  let seenDone = new Set();
  const stopDownloads = every(1000, async () => {
    const r = await api("/downloads");
    downloads.replaceChildren(...(r.downloads.length ? r.downloads.map((d) => h("div", { class: "card" },
      h("div", { class: "row" }, h("strong", {}, d.repo_id), h("span", { class: `badge ${d.state === "done" ? "ok" :
        d.state === "error" ? "bad" : ""}` }, d.state),
        h("span", { class: "muted small" }, `${bytes(d.received_bytes)} / ${bytes(d.total_bytes)} · files ${d.files_done}/${d.files_total}`
          + (d.state === "active" ? ` · ${bytes(d.bytes_per_sec)}/s` : ""))),
      d.state === "error" && !d.total_bytes ? "" : bar(d.total_bytes ? d.received_bytes / d.total_bytes : 0, `${d.repo_id} download`),
      d.current_file ? h("div", { class: "muted small" }, d.current_file) : "",
      d.error ? h("div", { class: "error small download-error" }, d.error) : "", failureDetail(d.detail)))
      : [h("p", { class: "muted" }, "No downloads yet.")]));
    const done = r.downloads.filter((d) => d.state === "done").map((d) => d.repo_id + d.finished_at);
    if (done.some((k) => !seenDone.has(k))) { seenDone = new Set(done); loadLibrary(false).catch(() => {}); }
  });
  // A demo model training in the background: its progress, and the library read again at each checkpoint.
  let servedStep = null;
  const stopDemo = every(2000, async () => {
    const health = await api("/health"), d = health.demo_build;
    demo.replaceChildren(...demoBuildCards(health));
    if (d && d.served_step !== servedStep) { servedStep = d.served_step; loadLibrary(false).catch(() => {}); }
  });
  loadLibrary(false).catch((e) => library.replaceChildren(h("p", { class: "error" }, e.message)));
  return () => { stopped = true; stopDownloads(); stopDemo(); fleet.source?.close(); fleet.source = null; };
}

// The exception behind a hub failure the server put into words: there for whoever debugs it, under the sentence.
function failureDetail(detail) {
  return detail ? h("div", { class: "muted small failure-detail" }, detail) : "";
}
