"""The model library and hub against a local hub double (`HF_ENDPOINT` on
loopback): registry rows and fit verdicts, downloads watched in flight,
killed and resumed from their partial files, duplicate refusals, search
(and search with the hub gone), GC on a cache whose revisions share blobs,
and a push that arrives at the double."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.browser import pages
from tests.helpers import HEARTH, ROOT, TINY_REPO, ServerProcess, build_tiny_model, server_env, sse_events
from tests.hub_double import HubDouble, Repo


@pytest.fixture(scope="module")
def tiny_files(tiny_model) -> dict[str, bytes]:
    from huggingface_hub import snapshot_download

    snapshot = Path(snapshot_download(tiny_model, local_files_only=True))
    return {str(p.relative_to(snapshot)): p.read_bytes() for p in snapshot.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def double(tiny_files):
    hub = HubDouble(bytes_per_sec=120_000)
    hub.add(Repo("mlx-community/tiny-a", tiny_files))
    hub.add(Repo("mlx-community/tiny-b", {**tiny_files, "README.md": b"second copy\n"}))
    hub.add(Repo("mlx-community/tiny-c", {**tiny_files, "README.md": b"third copy\n"}))
    hub.add(Repo("someone/torch-model", {"config.json": b"{}"}, tags=("pytorch",)))
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture(scope="module")
def homes_hub(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("hubhomes")
    build_tiny_model(root / "hf" / "hub")
    return root / "hf", root / "hearth"


def _env(homes_hub, double) -> dict:
    return dict(server_env(*homes_hub), HF_ENDPOINT=double.url, HF_HUB_OFFLINE="0")


@pytest.fixture(scope="module")
def hub_server(homes_hub, double, tmp_path_factory):
    proc = ServerProcess(_env(homes_hub, double), TINY_REPO, "--no-worker",
                         log_path=tmp_path_factory.mktemp("logs") / "hub.log")
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def _downloads(url: str) -> dict:
    return {d["repo_id"]: d for d in httpx.get(url + "/downloads").json()["downloads"]}


def _wait(url: str, repo: str, state: str = "done", timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = _downloads(url).get(repo)
        if row and row["state"] in (state, "error"):
            return row
        time.sleep(0.1)
    raise AssertionError(f"{repo} never reached {state}: {_downloads(url).get(repo)}")


def test_library_lists_the_cache_with_fit_verdicts(hub_server):
    first = httpx.get(hub_server.url + "/library", timeout=120)  # may wait for the one-time bandwidth probe
    models = {m["repo_id"]: m for m in first.json()["models"]}
    tiny = models[TINY_REPO]
    assert tiny["model_type"] == "llama" and tiny["supported"] and tiny["support_tier"] == "targeted"
    assert tiny["serving"] and tiny["quant_bits"] is None and not tiny["vision"] and not tiny["audio"]
    assert tiny["size_bytes"] > 0 and tiny["assessment"]["fits"] and tiny["assessment"]["predicted_decode_tps"] > 0
    local = httpx.get(hub_server.url + "/api/hub/local").json()
    assert local["ok"] and {"quant_group_size", "assessment"} <= set(local["models"][0])
    fit = httpx.get(hub_server.url + "/fit").json()
    assert fit["machine"]["bandwidth_gbs"] > 0 and fit["machine"]["cores"] >= 1
    assert fit["report"]["fits"] and fit["report"]["max_safe_context"] > 0
    assert fit["sku_matrix_ctx"] == 32768 and len(fit["sku_matrix"]) >= 5
    assert fit["typical_context_tokens"] <= 8192 and fit["measured_decode_tps"] is None


def test_download_shows_progress_refuses_duplicates_and_lands_in_the_library(hub_server, double):
    url = hub_server.url
    assert httpx.post(url + "/api/hub/download", json={"repo": "mlx-community/tiny-a"}).json() == {
        "ok": True, "repo": "mlx-community/tiny-a", "started": True}
    again = httpx.post(url + "/api/hub/download", json={"repo": "mlx-community/tiny-a"})
    assert again.status_code == 409 and "already in progress" in again.json()["error"]
    seen = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = _downloads(url)["mlx-community/tiny-a"]
        if row["state"] == "active" and 0 < row["received_bytes"] < row["total_bytes"]:
            seen.append(row)
        if row["state"] != "active":
            break
        time.sleep(0.05)
    assert len(seen) >= 3, "progress was never observed in flight"
    assert seen[-1]["received_bytes"] > seen[0]["received_bytes"] and seen[-1]["bytes_per_sec"] > 0
    assert "model.safetensors" in {row["current_file"] for row in seen}  # the big file was seen arriving
    assert seen[-1]["files_total"] == len(double.repos["mlx-community/tiny-a"].files)
    done = _wait(url, "mlx-community/tiny-a")
    assert done["state"] == "done" and done["received_bytes"] == done["total_bytes"] and done["finished_at"]
    assert done["files_done"] == done["files_total"]
    library = {m["repo_id"] for m in httpx.get(url + "/library").json()["models"]}  # no refresh needed
    assert "mlx-community/tiny-a" in library
    ids = [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]]
    assert ids[0] == TINY_REPO and "mlx-community/tiny-a" in ids

    httpx.post(url + "/api/hub/download", json={"repo": "nobody/nothing"})
    failed = _wait(url, "nobody/nothing")
    assert failed["state"] == "error" and "no such repository" in failed["error"]
    for body in ({}, {"repo": "no-slash"}, {"repo": "a/b", "revision": "../x"}):
        assert httpx.post(url + "/api/hub/download", json=body).status_code == 400


def _download_rows(hearth_home: Path, repo_id: str) -> list[dict]:
    """The rows as they are on disk, whoever is (or is not) serving."""
    with sqlite3.connect(hearth_home / "hearth.sqlite3") as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT * FROM hub_download WHERE repo_id = ? ORDER BY id", (repo_id,))]


def test_a_killed_download_resumes_from_its_partial_file(homes_hub, double, tiny_files, tmp_path):
    from tests.helpers import assert_no_strays

    env = _env(homes_hub, double)
    first = ServerProcess(env, TINY_REPO, log_path=tmp_path / "first.log").wait_ready()  # with its worker
    httpx.post(first.url + "/api/hub/download", json={"repo": "mlx-community/tiny-b"}).raise_for_status()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = _downloads(first.url)["mlx-community/tiny-b"]
        if row["current_file"] == "model.safetensors" and row["received_bytes"] > row["total_bytes"] // 3:
            break
        time.sleep(0.05)
    first.proc.send_signal(signal.SIGKILL)
    first.stop()
    assert_no_strays(homes_hub[1])  # its worker went with it
    [left] = _download_rows(homes_hub[1], "mlx-community/tiny-b")
    assert left["state"] == "active" and left["owner_pid"] == first.proc.pid and left["finished_at"] is None
    assert 0 < left["received_bytes"] < left["total_bytes"] and left["error"] is None
    blobs = homes_hub[0] / "hub" / "models--mlx-community--tiny-b" / "blobs"
    partial = [p for p in blobs.iterdir() if p.name.endswith(".incomplete")]
    assert len(partial) == 1 and 0 < partial[0].stat().st_size < len(tiny_files["model.safetensors"])
    kept = partial[0].stat().st_size

    second = ServerProcess(env, TINY_REPO, "--no-worker", log_path=tmp_path / "second.log").wait_ready()
    try:
        done = _wait(second.url, "mlx-community/tiny-b")
        assert done["state"] == "done", done
        assert "resuming the download of mlx-community/tiny-b" in second.output()
    finally:
        second.stop()
    [resumed] = _download_rows(homes_hub[1], "mlx-community/tiny-b")  # the same row, taken over, not a second one
    assert resumed["id"] == left["id"] and resumed["owner_pid"] == second.proc.pid
    assert resumed["state"] == "done" and resumed["error"] is None and resumed["finished_at"]
    assert resumed["received_bytes"] == resumed["total_bytes"] == left["total_bytes"]
    ranges = [r for m, p, r in double.requests if p.endswith("tiny-b/resolve/" + double.repos[
        "mlx-community/tiny-b"].sha + "/model.safetensors") and r]
    assert ranges and int(ranges[-1][6:].split("-")[0]) >= kept - 16 * 1024  # continued, not restarted
    snapshot = next((homes_hub[0] / "hub" / "models--mlx-community--tiny-b" / "snapshots").iterdir())
    for name, data in tiny_files.items():
        assert hashlib.sha256((snapshot / name).read_bytes()).digest() == hashlib.sha256(data).digest(), name
    assert not [p for p in blobs.iterdir() if p.name.endswith(".incomplete")]



def test_a_stopped_first_download_is_not_listed_until_it_finishes(double, tmp_path, monkeypatch):
    """A download stopped half-way (Ctrl-C, a kill, a dropped hub) leaves blobs and a partial file: no
    listing shows the repo as a model with files missing; the next run links the snapshot."""
    from huggingface_hub import constants

    from hub import registry
    from hub.download import Progress, download

    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "ENDPOINT", double.url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    progress = Progress()
    with pytest.raises(InterruptedError):
        download("mlx-community/tiny-a", "main", cache, None, progress, lambda p: None,
                 stop=lambda: progress.received_bytes > 64 << 10)
    root = cache / "models--mlx-community--tiny-a"
    assert [p for p in (root / "blobs").iterdir() if p.name.endswith(".incomplete")]  # kept for the next run
    assert registry.scan() == [] and registry.snapshot("mlx-community/tiny-a") is None

    commit, snapshot = download("mlx-community/tiny-a", "main", cache, None, Progress(), lambda p: None)
    [model] = registry.scan()
    assert model.repo_id == "mlx-community/tiny-a" and model.path == snapshot and model.commit == commit
    assert model.size_bytes == sum(len(data) for data in double.repos["mlx-community/tiny-a"].files.values())


def test_a_resumed_download_reports_the_rate_of_the_bytes_it_moves(double, tmp_path, monkeypatch):
    """A download that continues from blobs and a partial file an earlier run left counts them in
    `received_bytes`, not in `bytes_per_sec`: until its first byte arrives it reports 0 B/s (the
    bytes found on disk once made it report megabytes a second before anything moved)."""
    import django
    from django.core.management import call_command
    from huggingface_hub import constants

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)
    from hub import downloads
    from hub.models import Download

    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "ENDPOINT", double.url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    repo = "mlx-community/tiny-c"
    files = double.repos[repo].files
    before = sorted(name for name in files if name < "model.safetensors")
    assert len(before) >= 2  # blobs that are whole when the first run stops, found again on disk

    first = downloads.create(repo)
    seen: list = []
    stopped = downloads.run(first, report_extra=lambda p: seen.append(p.received_bytes), stop=lambda: seen[-1] > sum(
        len(files[name]) for name in before) + (64 << 10))
    assert stopped.state == "error" and "download stopped" in stopped.error
    blobs = cache / "models--mlx-community--tiny-c" / "blobs"
    on_disk = sum(p.stat().st_size for p in blobs.iterdir())
    assert [p for p in blobs.iterdir() if p.name.endswith(".incomplete")] and on_disk > sum(
        len(files[name]) for name in before)

    reports: list[tuple[int, float]] = []
    resumed = downloads.run(downloads.create(repo), report_extra=lambda p: reports.append(
        (p.received_bytes, p.bytes_per_sec)))
    assert resumed.state == "done" and resumed.received_bytes == resumed.total_bytes == sum(map(len, files.values()))
    found = [(received, rate) for received, rate in reports if received <= on_disk]  # before a byte arrived
    assert len(found) >= 3 and found[-1][0] == on_disk, found  # two whole blobs and the partial file, at least
    assert all(rate == 0 for _, rate in found), found
    assert any(rate > 0 for received, rate in reports if received > on_disk)
    assert Download.objects.get(pk=resumed.pk).bytes_per_sec == 0  # ended


def test_ctrl_c_stops_the_download_command_with_a_sentence_not_a_traceback(homes_hub, double, tmp_path):
    env = _env(homes_hub, double)
    root = homes_hub[0] / "hub" / "models--mlx-community--tiny-d"
    double.add(Repo("mlx-community/tiny-d", {**double.repos["mlx-community/tiny-a"].files, "README.md": b"d\n"}))
    with open(tmp_path / "out", "wb") as out:
        proc = subprocess.Popen([*HEARTH, "download", "mlx-community/tiny-d"], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 60
        while not list(root.glob("blobs/*.incomplete")):
            assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "out").read_text()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # as Ctrl-C does
        assert proc.wait(30) == 130
    said = (tmp_path / "out").read_text()
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
    assert said.rstrip().endswith("interrupted; `hearth download mlx-community/tiny-d` again continues from the "
                                  "partial files"), said[-400:]
    assert not (root / "snapshots").exists()
    [row] = _download_rows(homes_hub[1], "mlx-community/tiny-d")
    assert row["state"] == "error" and row["error"].startswith("interrupted")

    missing = subprocess.run([*HEARTH, "download", "nobody/nothing-here"], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "HTTP Request" not in missing.stderr, missing.stderr
    assert missing.stderr.strip().splitlines()[-1] == ("CommandError: download of nobody/nothing-here failed: no "
                                                       "such repository on the hub (or it is private and no token "
                                                       "is saved)"), missing.stderr

def test_download_command_shows_a_progress_bar(homes_hub, double, tiny_files):
    double.add(Repo("mlx-community/tiny-c", {**tiny_files, "README.md": b"third\n", "empty.txt": b""}))
    done = subprocess.run([*HEARTH, "download", "mlx-community/tiny-c"], cwd=ROOT, env=_env(homes_hub, double),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    count = len(tiny_files) + 2
    assert "100.0%" in done.stderr and f"files {count}/{count}" in done.stderr
    assert "mlx-community/tiny-c@" in done.stdout


def _snapshot_files(root: Path) -> dict[str, dict[str, bytes]]:
    return {s.name: {str(p.relative_to(s)): p.read_bytes() for p in s.rglob("*") if p.is_file()}
            for s in (root / "snapshots").iterdir()}


def test_gc_deletes_only_what_no_kept_revision_needs(hub_server, double, tiny_files, homes_hub):
    url, repo_id = hub_server.url, "mlx-community/tiny-gc"
    root = homes_hub[0] / "hub" / "models--mlx-community--tiny-gc"
    config = json.loads(tiny_files["config.json"])
    versions = [
        {**tiny_files, "config.json": json.dumps({**config, "note": "v1"}).encode()},
        {**tiny_files, "config.json": json.dumps({**config, "note": "v3"}).encode(), "extra.txt": b"only here"},
        {**tiny_files, "config.json": json.dumps({**config, "note": "v2"}).encode()},
    ]
    shas = []
    for files in versions:  # the last one downloaded is what refs/main names
        shas.append(double.add(Repo(repo_id, files)).sha)
        httpx.post(url + "/api/hub/download", json={"repo": repo_id}).raise_for_status()
        assert _wait(url, repo_id)["state"] == "done"
        time.sleep(0.05)
    assert (root / "refs" / "main").read_text() == shas[2]
    before = _snapshot_files(root)

    plan = httpx.get(url + "/api/gc/plan").json()
    rows = {r["repo_id"]: r for r in plan["superseded"]}
    revisions = {r["revision"]: (r["action"], r["why"]) for r in rows[repo_id].pop("revisions")}
    assert rows[repo_id] == {"repo_id": repo_id, "prune_snapshots": 1, "skipped_snapshots": 1, "dead_blobs": 1,
                             "reclaim_bytes": len(versions[0]["config.json"])}
    assert revisions == {shas[2]: ("keep", "named by a ref (the revision downloads track)"),
                         shas[1]: ("skip", "holds files no kept revision has"),
                         shas[0]: ("remove", "no ref names it and a kept revision has its files")}
    assert plan["reclaim_bytes"] >= rows[repo_id]["reclaim_bytes"]
    assert _snapshot_files(root) == before  # the plan deleted nothing
    refused = httpx.post(url + "/api/gc/execute", json={})
    assert refused.status_code == 400 and not refused.json()["ok"]
    result = httpx.post(url + "/api/gc/execute", json={"yes": True}).json()
    assert result["ok"] and result["snapshots"] >= 1 and result["blobs"] >= 1
    after = _snapshot_files(root)
    assert set(after) == {shas[1], shas[2]}
    for sha in (shas[1], shas[2]):  # every byte a kept or skipped revision needs is still there
        assert after[sha] == before[sha]
    (again,) = httpx.get(url + "/api/gc/plan").json()["superseded"]
    assert [r["action"] for r in again.pop("revisions")] == ["keep", "skip"]
    assert again == {"repo_id": repo_id, "prune_snapshots": 0, "skipped_snapshots": 1, "dead_blobs": 0,
                     "reclaim_bytes": 0}
    cli = subprocess.run([*HEARTH, "gc"], cwd=ROOT, env=_env(homes_hub, double), capture_output=True, text=True,
                         timeout=60)
    assert cli.returncode == 0 and "1 kept" in cli.stdout and "--yes" in cli.stdout


def test_push_arrives_at_the_hub(hub_server, double, tmp_path):
    url = hub_server.url
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapters.safetensors").write_bytes(os.urandom(5000))
    (folder / "adapter_config.json").write_text('{"fine_tune_type": "lora"}')
    (folder / "hf.json").write_text('{"token": "never uploaded"}')
    (folder / "train.jsonl").write_text('{"text": "a dataset push sends this"}\n')
    httpx.post(url + "/api/settings/hf-token", json={"token": "hf_test"}).raise_for_status()
    pushed = httpx.post(url + "/api/finetune/push", json={"repo_id": "me/my-adapter", "source_path": str(folder)})
    assert pushed.status_code == 200 and pushed.json()["ok"], pushed.text
    assert pushed.json()["url"].endswith("/me/my-adapter")
    arrived = double.uploads["me/my-adapter"]
    assert arrived == {"adapters.safetensors": (folder / "adapters.safetensors").read_bytes(),
                       "adapter_config.json": (folder / "adapter_config.json").read_bytes()}
    data = httpx.post(url + "/api/dataset/push", json={"repo_id": "me/my-data", "source_path": str(folder)}).json()
    assert data["ok"] and "/datasets/me/my-data" in data["url"]


def test_the_adapters_page_merges_exports_and_pushes(hub_server, homes_hub, double, tiny_model, browser):
    from huggingface_hub import snapshot_download

    from tests.helpers import ARTIFACTS, random_adapter, write_adapter

    url = hub_server.url
    snapshot = snapshot_download(tiny_model, local_files_only=True)
    root = homes_hub[1] / "adapters"
    write_adapter(root / "ui-alpha", random_adapter(snapshot, 2, 1), 1.5, None)
    beta = write_adapter(root / "ui-beta", random_adapter(snapshot, 1, 2), 0.5, None, layers=1)
    httpx.post(url + "/api/settings/hf-token", json={"token": "hf_test"}).raise_for_status()
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url + "/#/adapters")
    page.wait_for_selector('tr[data-adapter="ui-beta"]')

    page.select_option("select[aria-label='First adapter']", label="ui-alpha")
    page.select_option("select[aria-label='Second adapter']", label="ui-beta")
    page.click("form.merge button:has-text('Merge')")
    merged = Path(page.locator("form.merge [role=status] code").inner_text(timeout=30_000))
    assert (merged / "adapters.safetensors").is_file() and "scales 1.5 and 0.5" in page.inner_text("form.merge")
    page.wait_for_selector(f'tr[data-adapter="{merged.name}"]')  # the merged adapter joined the list

    page.click("button[aria-label='Export ui-alpha']")
    exported = Path(page.locator('tr[data-adapter="ui-alpha"] .exported code').inner_text(timeout=15_000))
    assert json.loads((exported / "manifest.json").read_text())["adapter_path"] == str(root / "ui-alpha")

    page.click("button[aria-label='Push ui-beta to the Hub']")
    page.fill("input[aria-label='Hub repo for ui-beta']", "me/ui-beta")
    page.click('tr[data-adapter="ui-beta"] .push-form button[type=submit]')
    page.wait_for_selector('tr[data-adapter="ui-beta"] .push a, tr[data-adapter="ui-beta"] .push .error',
                           timeout=60_000)
    assert page.locator('tr[data-adapter="ui-beta"] .push a').count() == 1, \
        page.inner_text('tr[data-adapter="ui-beta"] .push')
    assert double.uploads["me/ui-beta"]["adapters.safetensors"] == (beta / "adapters.safetensors").read_bytes()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "desktop-adapters-actions.png"), full_page=True)
    page.set_viewport_size({"width": 375, "height": 740})
    page.wait_for_timeout(200)
    page.screenshot(path=str(ARTIFACTS / "phone-adapters-actions.png"), full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth") <= 1

    # The chat's adapter picker: one for another base model is greyed out; a fitting one mounts when picked.
    write_adapter(root / "ui-foreign", random_adapter(snapshot, 1, 3), 1.0, "someone/other-model", layers=1)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(url + "/#/chat")
    picker = page.locator("select[aria-label=Adapter]")
    page.wait_for_selector("select[aria-label=Adapter] option[value=ui-foreign]", state="attached")
    assert picker.locator("option[value=ui-foreign]").is_disabled()
    assert "other base model" in picker.locator("option[value=ui-foreign]").inner_text()
    assert picker.locator("option[value=ui-alpha]").is_enabled()
    picker.select_option("ui-alpha")
    deadline = time.monotonic() + 15
    while "ui-alpha" not in {a["id"] for a in httpx.get(url + "/v1/adapters").json()["adapters"]}:
        assert time.monotonic() < deadline, "picking ui-alpha did not mount it"
        time.sleep(0.2)
    httpx.delete(url + "/v1/adapters/ui-alpha").raise_for_status()
    page.close()
    assert not errors, errors


def test_the_models_page_shows_a_download_moving(hub_server, double, tiny_files, browser):
    double.add(Repo("mlx-community/tiny-ui", {**tiny_files, "README.md": b"shown in the browser\n"}))
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(hub_server.url + "/#/models")
    page.fill("input[aria-label='Search models']", "tiny-ui")
    page.click("button:has-text('Search')")
    page.click("tr:has-text('mlx-community/tiny-ui') button:has-text('Download')")
    progress = page.locator("[aria-label='mlx-community/tiny-ui download']")
    progress.wait_for(timeout=15_000)
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not seen or seen[-1] < 100):
        seen.append(int(progress.get_attribute("aria-valuenow")))
        page.wait_for_timeout(250)
    assert seen[-1] == 100 and any(0 < v < 100 for v in seen), seen  # it moved while we watched
    page.wait_for_selector("td:has-text('mlx-community/tiny-ui')", timeout=15_000)  # and joined the library
    # A row that is not the served model shows a dash for its status, not an empty badge above it.
    assert pages.shown_though_hidden(page) == []
    page.close()


def test_router_downloads_a_model_it_is_asked_to_load(double, tmp_path):
    """Router mode: loading a repo the library lacks downloads it first, in a
    process of its own, with its progress on /models/sse; then it serves."""
    import threading

    hf, hearth = tmp_path / "hf", tmp_path / "hearth"
    build_tiny_model(hf / "hub")
    env = dict(server_env(hf, hearth), HF_ENDPOINT=double.url, HF_HUB_OFFLINE="0")
    proc = ServerProcess(env, "--default-model", TINY_REPO, "--no-worker", "--no-preload",
                         log_path=tmp_path / "router.log").wait_ready()
    try:
        events: list[tuple[str, dict]] = []

        def listen():
            for kind, data in sse_events(proc.url + "/models/sse"):
                events.append((kind, data))
                if kind == "model" and data["id"] == "mlx-community/tiny-c" and data["status"]["value"] == "loaded":
                    return

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        time.sleep(0.5)
        loaded = httpx.post(proc.url + "/models/load", json={"model": "mlx-community/tiny-c"}, timeout=120)
        assert loaded.status_code == 200, loaded.text
        listener.join(30)
        progress = [d for k, d in events if k == "progress" and d["model"] == "mlx-community/tiny-c"]
        downloading = [d for d in progress if d["stage"] == "downloading" and "download" in d]
        assert downloading and downloading[-1]["download"]["received_bytes"] > 0
        assert progress[-1]["stage"] == "ready"
        reply = httpx.post(proc.url + "/v1/chat/completions", timeout=60, json={
            "model": "mlx-community/tiny-c", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        assert reply.json()["model"] == "mlx-community/tiny-c"
        assert "mlx-community/tiny-c" in {m["id"] for m in httpx.get(proc.url + "/v1/models").json()["data"]}
    finally:
        assert proc.stop() == 0, proc.output()


def test_search_filters_to_mlx_and_survives_the_hub_going_away(hub_server, double, browser):
    url = hub_server.url
    found = httpx.get(url + "/api/hub/search", params={"q": "tiny"}).json()
    assert found["ok"] and not found["offline"]
    ids = {r["id"] for r in found["results"]}
    assert "mlx-community/tiny-a" in ids and all(r["size_estimate"] is None for r in found["results"])
    assert not {r["id"] for r in httpx.get(url + "/api/hub/search", params={"q": "torch"}).json()["results"]}
    assert httpx.get(url + "/api/hub/search").status_code == 400
    one_model = httpx.post(url + "/api/hub/serve", json={"model": "mlx-community/tiny-a"})
    assert one_model.status_code == 409 and "cannot switch" in one_model.json().pop("error")
    assert one_model.json() | {"error": ""} == {
        "ok": False, "error": "", "restart_required": True, "command": "hearth serve mlx-community/tiny-a",
        "router_command": "hearth serve"}
    double.stop()
    gone = httpx.get(url + "/api/hub/search", params={"q": "tiny"})
    assert gone.status_code == 200
    assert gone.json()["ok"] and gone.json()["offline"] and gone.json()["results"] == [] and gone.json()["error"]
    # Said in words, the exception as the detail; a download that cannot reach the hub is told the same way.
    unreachable = f"The Hugging Face Hub cannot be reached from this server ({double.url}):"
    assert gone.json()["error"].startswith(unreachable) and gone.json()["detail"].startswith("URLError: ")
    assert httpx.post(url + "/api/hub/download", json={"repo": "mlx-community/tiny-gone"}).status_code == 200
    failed = _wait(url, "mlx-community/tiny-gone")
    assert failed["error"].startswith(unreachable) and failed["detail"].startswith("ConnectError: "), failed
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(url + "/#/models")
    page.fill("input[aria-label='Search models']", "tiny")
    page.click("button:has-text('Search')")
    said = page.wait_for_selector("p.error:has-text('cannot be reached')")
    assert said.inner_text().startswith(unreachable) and "URLError" not in said.inner_text()
    assert page.inner_text("p.error + .failure-detail").startswith("URLError: ")
    card = ".card:has-text('mlx-community/tiny-gone')"
    assert page.inner_text(f"{card} .error").startswith(unreachable)
    assert page.inner_text(f"{card} .failure-detail").startswith("ConnectError: ")
    from tests.helpers import ARTIFACTS

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "desktop-models-hub-unreachable.png"), full_page=True)
    page.close()


def test_gc_keeps_a_served_snapshot_and_repos_no_ref_names(tmp_path):
    from hub import gc

    root = tmp_path / "models--org--m"
    for sha, blob in (("old", "b1"), ("new", "b2")):
        (root / "snapshots" / sha).mkdir(parents=True)
        (root / "blobs").mkdir(exist_ok=True)
        (root / "blobs" / blob).write_bytes(b"x" * 10)
        (root / "snapshots" / sha / "config.json").symlink_to(f"../../blobs/{blob}")
    (root / "blobs" / "b3.incomplete").write_bytes(b"partial")
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("new")
    [repo] = gc.plan(tmp_path)
    assert [p.name for p in repo.prune] == ["old"] and [b.name for b in repo.dead_blobs] == ["b1"]
    assert gc.plan(tmp_path, in_use=frozenset({(root / "snapshots" / "old").resolve()})) == []
    assert gc.plan(tmp_path, busy={"org/m"}) == []
    (root / "refs" / "main").unlink()  # nothing names a revision: the newest is kept
    [repo] = gc.plan(tmp_path)
    assert len(repo.prune) == 1 and len(repo.dead_blobs) == 1
    assert gc.execute(tmp_path)["blobs"] == 1 and (root / "blobs" / "b3.incomplete").exists()
    (root / "refs" / "main").write_text("new")
    (root / "snapshots" / "stray").mkdir()
    (root / "snapshots" / "stray" / "config.json").write_text("a real file, not a link")
    [repo] = gc.plan(tmp_path)
    assert [p.name for p in repo.skipped] == ["stray"] and not repo.prune  # never deleted
    from hub.locks import repo_lock

    with repo_lock(root):  # a download holds the repo: GC neither plans nor touches it
        assert gc.plan(tmp_path) == [] and gc.execute(tmp_path)["snapshots"] == 0
