"""Paths a request names stay inside HEARTH_HOME, the Hugging Face cache and
the folders allowed with --allow-path (the test run allows its tmp folder):
push, fine-tune, the dataset builder, mount, export, merge, inspect,
resolve-folder and memory init, against a real server whose HOME is a fake
owner's home outside those roots, with a loopback hub double for pushes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.helpers import TINY_REPO, ServerProcess, build_tiny_model, server_env
from tests.hub_double import HubDouble

SECRET_KEY = b"-----BEGIN OPENSSH PRIVATE KEY----- not for the hub\n"


class RecordingHub(HubDouble):
    """The hub double, also keeping each repo-creation request (its `private` flag)."""

    def __init__(self):
        self.created: list[dict] = []
        super().__init__()

    def _handler(self):
        base, double = super()._handler(), self

        class Handler(base):
            def _body(self):
                body = super()._body()
                if urlsplit(self.path).path == "/api/repos/create":
                    double.created.append(json.loads(body or b"{}"))
                return body

        return Handler


@pytest.fixture(scope="module")
def victim_home():
    """The owner's home: outside every allowed root (not under the test run's tmp folder)."""
    home = Path(tempfile.mkdtemp(prefix="hearth-victim-"))
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_bytes(SECRET_KEY)
    (home / ".netrc").write_text("machine example.com login owner password hunter2\n")
    adapter = home / "adapter"  # looks like an artifact, so old code would act on it
    adapter.mkdir()
    _write_lora(adapter)
    (home / "data").mkdir()
    (home / "data" / "train.jsonl").write_text(json.dumps({"text": "private notes"}) + "\n")
    (home / "model").mkdir()
    (home / "model" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def hub():
    double = RecordingHub().start()
    yield double
    double.stop()


@pytest.fixture(scope="module")
def confined(tmp_path_factory, victim_home, hub):
    root = tmp_path_factory.mktemp("confined-homes")
    build_tiny_model(root / "hf" / "hub")
    env = dict(server_env(root / "hf", root / "hearth"), HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="0",
               HOME=str(victim_home))
    proc = ServerProcess(env, TINY_REPO, "--no-worker", log_path=tmp_path_factory.mktemp("logs") / "confined.log")
    proc.hearth_home = root / "hearth"
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def _private(created: dict) -> bool | None:
    """The privacy a repo-creation request asked for (newer clients send `visibility`)."""
    return created["visibility"] == "private" if "visibility" in created else created.get("private")


def _write_lora(folder: Path, config: bool = True) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"model.layers.0.self_attn.q_proj.lora_a": np.zeros((64, 2), np.float32),
               "model.layers.0.self_attn.q_proj.lora_b": np.zeros((2, 64), np.float32)},
              str(folder / "adapters.safetensors"))
    if config:
        (folder / "adapter_config.json").write_text(json.dumps({"fine_tune_type": "lora", "num_layers": 1,
                                                                 "lora_parameters": {"rank": 2, "scale": 1.0}}))


def test_push_of_the_owners_home_is_refused_and_sends_nothing(confined, hub, victim_home):
    url = confined.url
    httpx.post(url + "/api/settings/hf-token", json={"token": "hf_owner"}).raise_for_status()
    try:
        for source in ("~", str(victim_home), str(victim_home / "no-such-folder"), "~/.ssh"):
            r = httpx.post(url + "/api/finetune/push", json={"repo_id": "victim/x", "source_path": source,
                                                            "private": False})
            assert r.status_code == 400 and "--allow-path" in r.json()["error"], (source, r.text)
        # Existing and missing folders outside the roots get the same answer.
        answers = {httpx.post(url + "/api/dataset/push", json={"repo_id": "victim/x", "source_path": s}).text
                   for s in (str(victim_home), str(victim_home / "missing"))}
        assert len(answers) == 1
        assert "victim/x" not in hub.uploads and hub.created == []
        assert not any(SECRET_KEY in content for files in hub.uploads.values() for content in files.values())
    finally:
        httpx.delete(url + "/api/settings/hf-token")


def test_push_sends_only_the_artifacts_files_and_is_private_by_default(confined, hub, victim_home, tmp_path):
    url = confined.url
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapters.safetensors").write_bytes(os.urandom(3000))
    (folder / "adapter_config.json").write_text('{"fine_tune_type": "lora"}')
    (folder / "hf.json").write_text('{"token": "hf_owner"}')
    (folder / ".env").write_text("SECRET=1\n")
    (folder / "notes.txt").write_text("private notes\n")
    (folder / "0000100_adapters.safetensors").write_bytes(b"checkpoint")
    (folder / ".ssh").mkdir()
    (folder / ".ssh" / "id_ed25519").write_bytes(SECRET_KEY)
    (folder / "README.md").symlink_to(victim_home / ".netrc")  # a link that leads out of the roots
    httpx.post(url + "/api/settings/hf-token", json={"token": "hf_owner"}).raise_for_status()
    try:
        r = httpx.post(url + "/api/finetune/push", json={"repo_id": "me/adapter", "source_path": str(folder)})
        assert r.status_code == 200 and r.json()["ok"], r.text
        assert hub.uploads["me/adapter"] == {"adapters.safetensors": (folder / "adapters.safetensors").read_bytes(),
                                             "adapter_config.json": (folder / "adapter_config.json").read_bytes()}
        assert _private(hub.created[-1]) is True
        r = httpx.post(url + "/api/finetune/push", json={"repo_id": "me/public", "source_path": str(folder),
                                                        "private": False})
        assert r.status_code == 200 and _private(hub.created[-1]) is False
        assert httpx.post(url + "/api/finetune/push", json={"repo_id": "me/x", "source_path": str(folder),
                                                            "private": "no"}).status_code == 400
        # HEARTH_HOME itself is no artifact, even though it is inside the roots.
        home = httpx.post(url + "/api/dataset/push",
                          json={"repo_id": "me/home", "source_path": str(confined.hearth_home)})
        assert home.status_code == 400 and "me/home" not in hub.uploads
    finally:
        httpx.delete(url + "/api/settings/hf-token")


def test_finetune_paths_outside_the_roots_are_refused(confined, victim_home, tmp_path):
    url = confined.url
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(json.dumps({"text": "hi"}) + "\n")
    escape = victim_home / "made-by-hearth" / "adapter"
    for field, value in [("adapter_path", str(escape)), ("data_dir", str(victim_home / "data")),
                         ("data_dir", "/etc"), ("warm_start_adapter", str(victim_home / "adapter")),
                         ("model_dir", str(victim_home / "model"))]:
        body = {"model_dir": TINY_REPO, "data_dir": str(data), field: value}
        r = httpx.post(url + "/api/finetune/submit", json=body)
        assert r.status_code == 400 and field in r.json()["error"] and "--allow-path" in r.json()["error"], body
    assert not (victim_home / "made-by-hearth").exists()
    # A data file that is a link out of an allowed folder is refused too.
    (data / "valid.jsonl").symlink_to(victim_home / "data" / "train.jsonl")
    r = httpx.post(url + "/api/finetune/submit", json={"model_dir": TINY_REPO, "data_dir": str(data)})
    assert r.status_code == 400, r.text


def test_the_dataset_builder_reads_no_file_outside_the_roots(confined, victim_home, tmp_path):
    url = confined.url
    answers = set()
    for path in ("/etc/passwd", "/etc/no-such-file", str(victim_home / ".netrc")):
        r = httpx.post(url + "/api/dataset/submit", json={"template_id": "table-to-messages",
                                                          "inputs": {"path": path}})
        assert r.status_code == 400 and "--allow-path" in r.json()["error"], r.text
        answers.add(r.text)
    assert len(answers) == 1
    # The job's child checks again before it opens anything.
    from core.paths import PathRefused
    from jobs.kinds import tabular

    with pytest.raises(PathRefused):
        tabular.source_text({"path": "/etc/passwd"})
    link = tmp_path / "rows.csv"
    link.symlink_to("/etc/passwd")
    with pytest.raises(PathRefused):
        tabular.source_text({"path": str(link)})


def test_routes_do_not_reveal_whether_an_outside_path_exists(confined, victim_home):
    url = confined.url
    there, missing = victim_home, victim_home / "nothing-here"
    cases = [
        ("/v1/adapters", lambda p: {"id": "x", "path": str(p / "adapter")}),
        ("/api/finetune/export", lambda p: {"base_model": "x", "adapter_path": str(p / "adapter")}),
        ("/api/finetune/merge", lambda p: {"adapter_a": str(p / "adapter"), "adapter_b": str(p / "adapter")}),
        ("/api/finetune/inspect-dataset", lambda p: {"path": str(p / "data")}),
        ("/api/quantize/inspect", lambda p: {"model_id": str(p / "model")}),
        ("/api/quantize/submit", lambda p: {"model_id": str(p / "model")}),
        ("/api/model/resolve-folder", lambda p: {"rel_path": str(p / "model")}),
        ("/api/quantize/resolve-folder", lambda p: {"folder_name": str(p / "model")}),
    ]
    for route, body in cases:
        found, absent = (httpx.post(url + route, json=body(p), timeout=30) for p in (there, missing))
        assert found.status_code == absent.status_code == 400, (route, found.text, absent.text)
        assert found.json() == absent.json() and "--allow-path" in found.text, (route, found.text, absent.text)
    assert httpx.get(url + "/v1/adapters").json()["adapters"] == []
    # A relative name that climbs out of the cache is refused the same way.
    climb = httpx.post(url + "/api/model/resolve-folder", json={"rel_path": "../../../../../../../etc"})
    assert climb.status_code == 400


def test_fifos_are_refused_before_they_are_opened(confined, tmp_path):
    url = confined.url
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    _write_lora(adapter, config=False)
    os.mkfifo(adapter / "adapter_config.json")  # opening it for reading would wait for a writer forever
    r = httpx.post(url + "/api/finetune/merge", json={"adapter_a": str(adapter), "adapter_b": str(adapter)},
                   timeout=20)
    assert r.status_code == 400 and "not a regular file" in r.json()["error"], r.text
    mount = httpx.post(url + "/v1/adapters", json={"id": "fifo", "path": str(adapter)}, timeout=20)
    assert mount.status_code == 400 and "not a regular file" in mount.json()["error"]["message"]
    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "train.jsonl")
    r = httpx.post(url + "/api/finetune/submit", json={"model_dir": TINY_REPO, "data_dir": str(data)}, timeout=20)
    assert r.status_code == 400 and "not a regular file" in r.json()["error"], r.text
    r = httpx.post(url + "/api/finetune/inspect-dataset", json={"path": str(data)}, timeout=20)
    assert r.status_code == 400 and "not a regular file" in r.json()["error"], r.text
    rows = tmp_path / "rows.csv"
    os.mkfifo(rows)
    r = httpx.post(url + "/api/dataset/submit", json={"template_id": "table-to-messages",
                                                      "inputs": {"path": str(rows)}}, timeout=20)
    assert r.status_code == 400 and "not a regular file" in r.json()["error"], r.text


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=Owner", "-c", "user.email=o@example.com",
                           *args], check=True, capture_output=True, text=True).stdout


def _owner_repo(root: Path, canary: Path) -> str:
    """A repository of the owner's, whose core.fsmonitor command leaves `canary` if git ever runs it."""
    root.mkdir(parents=True)
    _git(root, "init", "-q", "-b", "main")
    (root / "notes.md").write_text("mine\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "owner's commit")
    _git(root, "config", "core.fsmonitor", f"touch {canary}; false")
    return _git(root, "log", "--format=%H")


def test_memory_init_never_writes_into_a_repository_it_did_not_create(confined, victim_home, tmp_path):
    url = confined.url
    canary = victim_home / "fsmonitor-ran"
    for root, status in [(victim_home / "notes", 400), (tmp_path / "notes", 409)]:
        log = _owner_repo(root, canary)
        r = httpx.post(url + "/api/memory/init", json={"path": str(root), "name": root.parent.name[:60]})
        assert r.status_code == status and not r.json()["ok"], r.text
        assert _git(root, "log", "--format=%H") == log
        assert sorted(p.name for p in root.iterdir()) == [".git", "notes.md"]
    assert not canary.exists()
    # A vault Hearth makes is its own: setting it up again is fine.
    fresh = tmp_path / "vault"
    for _ in range(2):
        r = httpx.post(url + "/api/memory/init", json={"path": str(fresh), "name": "fresh"})
        assert r.status_code == 200 and r.json()["ok"], r.text
    # HEARTH_HOME itself is no vault folder.
    r = httpx.post(url + "/api/memory/init", json={"path": str(confined.hearth_home), "name": "home"})
    assert r.status_code == 400


# -- FIFOs, devices and sockets where a file is expected ---------------------------
# Each case answers promptly instead of opening the FIFO. Should a regression
# open one, `_unblock` gives the stuck reader an end of file, so the test
# fails on its short timeout instead of leaving a server thread hanging.
def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _unblock(*fifos: Path) -> None:
    for fifo in fifos:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: nobody is reading it, as it should be
            pass


def _within(seconds: float, fn, *fifos: Path):
    """What `fn()` returns or raises, failing the test if it is still blocked after `seconds`."""
    import threading

    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        _unblock(*fifos)
        thread.join(5)
        pytest.fail(f"still blocked after {seconds} s: a FIFO was opened")
    return box.get("error", box.get("value"))


def test_read_json_and_regular_entries_refuse_what_is_not_a_regular_file(tmp_path):
    import socket

    from core.paths import PathRefused, read_json, regular_entries

    (tmp_path / "ok.json").write_text('{"a": 1}')
    fifo = _fifo(tmp_path / "pipe.json")
    assert _within(5, lambda: read_json(tmp_path / "ok.json")) == {"a": 1}
    assert isinstance(_within(5, lambda: read_json(tmp_path / "missing.json")), FileNotFoundError)
    refused = _within(5, lambda: read_json(fifo, "config"), fifo)
    assert isinstance(refused, PathRefused) and str(refused) == f"config: {fifo} is not a regular file"
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "sub").mkdir()
    (folder / "gone.json").symlink_to(tmp_path / "nothing")  # a broken link is the loader's to report
    regular_entries(folder, "model")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(folder / "tokenizer.json"))
        with pytest.raises(PathRefused, match="tokenizer.json is not a regular file"):
            regular_entries(folder, "model")
        regular_entries(folder, "model", "*.safetensors")  # only names matching the pattern count


def test_the_adapter_listing_never_opens_a_fifo(confined):
    url = confined.url
    adapters = confined.hearth_home / "adapters"
    config_fifo, weights_fifo = adapters / "fifo-config", adapters / "fifo-weights"
    for folder in (config_fifo, weights_fifo):
        folder.mkdir(parents=True)
    _write_lora(config_fifo, config=False)
    fifos = (_fifo(config_fifo / "adapter_config.json"), _fifo(weights_fifo / "adapters.safetensors"))
    try:
        r = httpx.get(url + "/v1/adapters/available", timeout=10)
        assert r.status_code == 200, r.text
        rows = {row["id"]: row for row in r.json()["adapters"]}
        assert rows["fifo-config"]["rank"] is None and "fifo-weights" not in rows
        for folder in (config_fifo, weights_fifo):
            mount = httpx.post(url + "/v1/adapters", json={"id": "fifo", "path": str(folder)}, timeout=10)
            assert mount.status_code == 400 and "is not a regular file" in mount.json()["error"]["message"]
    finally:
        _unblock(*fifos)
        for folder in (config_fifo, weights_fifo):
            shutil.rmtree(folder)


def test_model_folders_holding_a_fifo_are_refused_by_jobs(confined, tmp_path):
    url = confined.url
    model, bare, data = tmp_path / "model", tmp_path / "bare", tmp_path / "data"
    for folder in (model, bare, data):
        folder.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (data / "train.jsonl").write_text(json.dumps({"text": "hi"}) + "\n")
    fifos = (_fifo(model / "generation_config.json"), _fifo(bare / "config.json"))
    try:
        for route, body in [("/api/finetune/submit", {"model_dir": str(model), "data_dir": str(data)}),
                            ("/api/quantize/submit", {"model_id": str(model)}),
                            ("/api/quantize/submit", {"model_id": str(bare)})]:
            r = httpx.post(url + route, json=body, timeout=10)
            assert r.status_code == 400 and "is not a regular file" in r.json()["error"], (route, r.text)
        assert f"{model / 'generation_config.json'} is not a regular file" in httpx.post(
            url + "/api/quantize/submit", json={"model_id": str(model)}, timeout=10).json()["error"]
        r = httpx.post(url + "/api/quantize/inspect", json={"model_id": str(bare)}, timeout=10)
        assert r.status_code == 404 and "is not a regular file" in r.json()["error"], r.text  # the loader finds none
        r = httpx.post(url + "/api/model/resolve-folder", json={"rel_path": str(bare)}, timeout=10)
        assert r.status_code == 404 and r.json()["ok"] is False
    finally:
        _unblock(*fifos)


def test_the_loader_refuses_a_model_folder_holding_a_fifo(tmp_path):
    from inference.engine import loader
    from inference.engine.errors import ModelLoadError

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    fifo = _fifo(model / "generation_config.json")  # mlx-lm opens it by name, before any weights
    error = _within(15, lambda: loader.load(str(model)), fifo)
    assert isinstance(error, ModelLoadError), error
    assert f"{fifo} is not a regular file" in str(error)


def test_the_library_scan_never_opens_a_fifo_in_the_cache(confined):
    repo = confined.hearth_home.parent / "hf" / "hub" / "models--fifo--refs"
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (snapshot / "config.json").write_text(json.dumps({"model_type": "llama"}))
    fifos = (_fifo(repo / "refs" / "main"), _fifo(snapshot / "model.safetensors"))
    try:
        r = httpx.get(confined.url + "/library?refresh=1", timeout=30)
        assert r.status_code == 200, r.text
        assert "fifo/refs" in {m["repo_id"] for m in r.json()["models"]}
    finally:
        _unblock(*fifos)
        shutil.rmtree(repo)


def test_a_fifo_in_a_memory_vault_is_never_opened(confined, tmp_path):
    url = confined.url
    root = tmp_path / "fifo-vault"
    r = httpx.post(url + "/api/memory/init", json={"path": str(root), "name": "fifo-vault"}, timeout=30)
    assert r.status_code == 200, r.text
    (root / "articles" / "Real.md").write_text("# Real\n\nSee [[x]].\n")
    fifos = (_fifo(root / "articles" / "x.md"), _fifo(root / "Reference" / "pipe.md"))
    q = {"vault": "fifo-vault"}
    try:
        listing = httpx.get(url + "/api/memory/list", params=q, timeout=10).json()
        assert listing["articles"] == ["Real"] and listing["reference"] == [], listing
        found = httpx.get(url + "/api/memory/search", params={**q, "q": "see"}, timeout=10)
        assert found.status_code == 200 and [s["article"] for s in found.json()["summaries"]] == ["Real"]
        for route, name in [("article", "x"), ("links", "x"), ("article", "Reference/pipe")]:
            r = httpx.get(url + f"/api/memory/{route}", params={**q, "name": name}, timeout=10)
            assert r.status_code == 400 and "is not a regular file" in r.json()["error"], (route, r.text)
        links = httpx.get(url + "/api/memory/links", params={**q, "name": "Real"}, timeout=10).json()
        assert links["outbound"] == ["x"] and links["missing"] == ["x"], links
        status = httpx.get(url + "/api/memory/status", params=q, timeout=10).json()
        assert status["status"]["article_count"] == 1
    finally:
        _unblock(*fifos)


def test_the_coding_tools_refuse_a_fifo_in_the_workspace(tmp_path, monkeypatch):
    from chat import tools

    monkeypatch.setattr(tools, "workspace", lambda: tmp_path.resolve())
    fifo = _fifo(tmp_path / "pipe.txt")
    (tmp_path / "notes.txt").write_text("one\ntwo\n")
    calls = [("read", {"path": "pipe.txt"}), ("edit", {"path": "pipe.txt", "old_string": "a", "new_string": "b"}),
             ("write", {"path": "pipe.txt", "content": "x"})]
    for name, args in calls:
        ok, text = _within(5, lambda n=name, a=args: tools.call_sync(tools.CODING_TOOLS[n], a), fifo)
        assert not ok and text == "error: path: pipe.txt is not a regular file", (name, text)
    assert fifo.is_fifo()  # `write` left it as it was
    # A regular file swapped for a FIFO after the check is still refused when it is opened.
    monkeypatch.setattr(tools, "_existing_file", lambda raw: tools.resolve(raw))
    ok, text = _within(5, lambda: tools.call_sync(tools.CODING_TOOLS["read"], {"path": "pipe.txt"}), fifo)
    assert not ok and "is not a regular file" in text
    assert tools.call_sync(tools.CODING_TOOLS["read"], {"path": "notes.txt"}) == (True, "     1\tone\n     2\ttwo")


def test_hearths_own_secrets_are_never_an_input_nor_pushed(confined, hub, tmp_path):
    """The Hub token (and the secret key, the database, MCP settings) under HEARTH_HOME: refused as a
    job's input, and never pushed, even through a symlink in an artifact's folder."""
    url = confined.url
    httpx.post(url + "/api/settings/hf-token", json={"token": "hf_owner_secret"}).raise_for_status()
    try:
        token_file = confined.hearth_home / "hf.json"
        assert token_file.is_file()
        for secret in (token_file, confined.hearth_home / "secret_key", confined.hearth_home / "hearth.sqlite3"):
            r = httpx.post(url + "/api/dataset/submit", json={"template_id": "table-to-messages",
                                                              "inputs": {"path": str(secret)}})
            assert r.status_code == 400 and "secrets" in r.json()["error"], (secret, r.text)
        folder = tmp_path / "dataset"
        folder.mkdir()
        (folder / "train.jsonl").write_text('{"messages": []}\n')
        (folder / "valid.jsonl").symlink_to(token_file)  # a link into HEARTH_HOME's secrets
        r = httpx.post(url + "/api/dataset/push", json={"repo_id": "me/data", "source_path": str(folder)})
        assert r.status_code == 200 and r.json()["ok"], r.text
        assert set(hub.uploads["me/data"]) == {"train.jsonl"}
        assert not any(b"hf_owner_secret" in content for files in hub.uploads.values() for content in files.values())
    finally:
        httpx.delete(url + "/api/settings/hf-token")


def test_the_servers_key_files_are_secrets_too(tmp_path, monkeypatch):
    """`--api-key-file` files (exported to the server's children) are refused wherever they are."""
    from core import paths

    keys = tmp_path / "keys.txt"  # inside the run's allowed folder
    keys.write_text("sk-1\n")
    assert paths.confine(str(keys)) == keys.resolve()
    monkeypatch.setenv(paths.SECRET_FILES_ENV, str(keys.resolve()))
    link = tmp_path / "innocent.csv"
    link.symlink_to(keys)
    for named in (keys, link):
        with pytest.raises(paths.PathRefused, match="secrets"):
            paths.confine(str(named))
