"""The Ollama-style model commands against a temp HF cache and one real
single-model server: `hearth ls` (with and without a server), `hearth ps`,
`hearth rm` (asks on a terminal, wants --yes elsewhere, refuses unknown and
loaded models), `hearth pull` (the download command under another name,
against the hub double) and `hearth run` (a chat over a pipe).

Each command runs once or more as a real `hearth` process (the console
script's dispatch, its exit status, all it writes, a terminal); the other
calls run the same command in this process (`here`), which parses the
same arguments and reads the same environment, without a second of
interpreter start each."""
from __future__ import annotations

import io
import json
import os
import pty
import select
import shutil
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from tests.helpers import HEARTH, ROOT, TINY_REPO, ServerProcess, build_tiny_model, free_port, server_env
from tests.hub_double import HubDouble, Repo

QUANT_REPO = "hearth-test/tiny-q"


@pytest.fixture(scope="module")
def homes(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("climodels")
    build_tiny_model(root / "hf" / "hub")
    build_tiny_model(root / "hf" / "hub", repo_id=QUANT_REPO, quantize=True)
    return root / "hf", root / "hearth"


@pytest.fixture(scope="module")
def env(homes) -> dict:
    # HEARTH_URL names a port nothing listens on, so "no server" is the default here.
    return dict(server_env(*homes), HEARTH_URL=f"http://127.0.0.1:{free_port()}")


@pytest.fixture(scope="module")
def server(env, tmp_path_factory):
    proc = ServerProcess(env, TINY_REPO, "--no-worker", "--max-tokens", "24",
                         log_path=tmp_path_factory.mktemp("logs") / "cli-models.log")
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def hearth(env, *args: str, stdin: str | None = "", timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*HEARTH, *args], cwd=ROOT, env=env, input=stdin, capture_output=True, text=True,
                          timeout=timeout)


def here(env, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    """`hearth ARGS` in this process: the command `hearth` would run, given the same arguments, reading
    `env`'s homes, server address and hub, with `stdin` as a pipe; what it wrote and its exit status."""
    import django
    from django.core.management import load_command_class
    from huggingface_hub import constants

    from hearth.cli import hearth_commands

    django.setup()
    app, name = hearth_commands()[args[0]]
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        for key in ("HF_HOME", "HEARTH_HOME", "HEARTH_URL", "HF_ENDPOINT", "HF_HUB_OFFLINE"):
            if key in env:
                patch.setenv(key, env[key])
            else:
                patch.delenv(key, raising=False)
        # huggingface_hub reads these once, at import: as a process started with `env` would have them.
        patch.setattr(constants, "HF_HUB_CACHE", str(Path(env["HF_HOME"]) / "hub"))
        patch.setattr(constants, "ENDPOINT", env.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/"))
        patch.setattr(constants, "HF_HUB_OFFLINE", env.get("HF_HUB_OFFLINE") == "1")
        patch.setattr(sys, "stdin", io.StringIO(stdin))  # a pipe, not a terminal
        code: int | str | None = 0
        with redirect_stdout(out), redirect_stderr(err):
            try:
                load_command_class(app, name).run_from_argv(["hearth", args[0], *args[1:]])
            except SystemExit as exc:
                code = exc.code
    return subprocess.CompletedProcess(args, code or 0, out.getvalue(), err.getvalue())


def on_a_terminal(env, *args: str, answer: str, timeout: float = 60) -> tuple[int, str]:
    """Run with a pseudo-terminal as stdin and stdout, answer the first prompt, return (code, all output)."""
    main, side = pty.openpty()
    proc = subprocess.Popen([*HEARTH, *args], cwd=ROOT, env=env, stdin=side, stdout=side, stderr=side)
    os.close(side)
    output, answered, deadline = b"", False, time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([main], [], [], 0.1)[0]:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the other side closed
                break
            output += chunk
            if not answered and b"[y/N]" in output:
                os.write(main, answer.encode())
                answered = True
        elif proc.poll() is not None:
            break
    os.close(main)
    return proc.wait(timeout), output.decode(errors="replace")


def copy_repo(hf_home: Path, source: str, target: str) -> Path:
    """Another repo in the cache with the same files (links stay links)."""
    hub = hf_home / "hub"
    folder = hub / ("models--" + target.replace("/", "--"))
    shutil.copytree(hub / ("models--" + source.replace("/", "--")), folder, symlinks=True)
    return folder


def listed(env, *args: str) -> dict[str, dict]:
    done = here(env, "ls", "--json", *args)
    assert done.returncode == 0, done.stderr
    return {row["name"]: row for row in json.loads(done.stdout)}


def test_ls_shows_the_library_and_what_a_server_has_loaded(env, server):
    alone = hearth(env, "ls")
    assert alone.returncode == 0, alone.stderr
    lines = alone.stdout.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "QUANT", "FIT", "LOADED"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows[TINY_REPO][2:] == ["KB", "f32", "yes", "—"]  # a 400-odd KB float32 model that fits
    assert rows[QUANT_REPO][3:] == ["4-bit", "yes", "—"]
    assert f"no server at {env['HEARTH_URL']}" in alone.stderr and alone.stderr.count("\n") == 1

    served = hearth(env, "ls", "--url", server.url)
    assert served.returncode == 0, served.stderr
    rows = {line.split()[0]: line.split() for line in served.stdout.splitlines()[1:]}
    assert rows[TINY_REPO][-1] == "yes" and rows[QUANT_REPO][-1] == "no"
    assert served.stderr == ""

    as_json = listed(env, "--url", server.url)
    assert as_json[TINY_REPO] == {"name": TINY_REPO, "size_bytes": as_json[TINY_REPO]["size_bytes"], "quant": "f32",
                                  "fits": True, "loaded": "yes"}
    assert as_json[TINY_REPO]["size_bytes"] > 100_000 and as_json[QUANT_REPO]["loaded"] == "no"


def test_ls_on_an_empty_cache_says_which_cache_it_read_when_the_server_lists_models(env, server, tmp_path):
    """`hearth ls` run with another HF_HOME than the server's (a second Hearth on the machine, its
    variables not set in this shell): its cache is empty, the server lists a model, and it says
    which cache it read and what to set, where it said only that there were no models yet."""
    other = dict(env, HF_HOME=str(tmp_path / "empty-hf"))
    done = here(other, "ls", "--url", server.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["NAME", "SIZE", "QUANT", "FIT", "LOADED"]
    said = done.stderr
    assert f"no models in this cache ({tmp_path / 'empty-hf' / 'hub'})" in said, said
    assert f"the server at {server.url} lists 1 ({TINY_REPO})" in said and "HF_HOME" in said, said
    assert "no models in the local cache yet" not in said
    alone = here(other, "ls")  # no server: as before
    assert "no models in the local cache yet" in alone.stderr, alone.stderr


def test_ps_lists_the_loaded_model_or_says_there_is_no_server(env, server):
    shown = here(env, "ps", "--url", server.url)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "MEMORY", "IDLE", "PINNED", "INFLIGHT"]
    assert [line.split()[:2] for line in lines[1:]] == [[TINY_REPO, "loaded"]]
    rows = json.loads(here(env, "ps", "--json", "--url", server.url).stdout)
    assert [(row["id"], row["status"]["value"]) for row in rows] == [(TINY_REPO, "loaded")]
    assert rows[0]["inflight"] == 0  # the request that asks is not counted

    absent = hearth(env, "ps")  # the process: its status and every line it writes
    assert absent.returncode == 1 and absent.stdout == ""
    assert absent.stderr == f"hearth ps: no server at {env['HEARTH_URL']} (start one with hearth serve)\n"


def test_rm_asks_wants_yes_off_a_terminal_and_refuses_unknown_or_loaded_models(env, homes, server):
    unknown = here(env, "rm", "hearth-test/nowhere", "--yes")
    assert unknown.returncode == 1
    assert "hearth-test/nowhere" in unknown.stderr and "hearth ls" in unknown.stderr

    spare = copy_repo(homes[0], TINY_REPO, "hearth-test/spare")
    piped = here(env, "rm", "hearth-test/spare")  # stdin is a pipe: no one to ask
    assert piped.returncode == 2 and "--yes" in piped.stderr and spare.is_dir()

    code, output = on_a_terminal(env, "rm", "hearth-test/spare", answer="n\n")
    assert code == 1 and "Remove hearth-test/spare (" in output and spare.is_dir()
    code, output = on_a_terminal(env, "rm", "hearth-test/spare", answer="y\n")
    assert code == 0, output
    assert "removed hearth-test/spare" in output and not spare.exists()

    copy_repo(homes[0], TINY_REPO, "hearth-test/spare-2")
    removed = here(env, "rm", "hearth-test/spare-2", "--yes")
    assert removed.returncode == 0, removed.stderr
    assert "hearth-test/spare-2" not in listed(env)
    assert (homes[1] / "library-changed").is_file()  # other processes' listings turn over

    loaded = f"hearth rm: {TINY_REPO} is loaded; unload it first (POST /models/unload or the dashboard)\n"
    # The server's word, then this machine's serving records alone (in a process of its own).
    for run, args in ((here, ("--url", server.url)), (hearth, ())):
        refused = run(env, "rm", TINY_REPO, "--yes", *args)
        assert (refused.returncode, refused.stderr) == (1, loaded), args
    assert (homes[0] / "hub" / "models--hearth-test--tiny-random").is_dir()


def test_pull_is_download_under_another_name(env, homes):
    snapshot = next((homes[0] / "hub" / "models--hearth-test--tiny-random" / "snapshots").iterdir())
    double = HubDouble().start()
    try:
        double.add(Repo.from_dir("mlx-community/tiny-pulled", snapshot))
        # A process: a download writes its row into the database of the home it runs in, and in this
        # process Django's database is the worker's, not env's.
        done = hearth(dict(env, HF_ENDPOINT=double.url, HF_HUB_OFFLINE="0"), "pull", "mlx-community/tiny-pulled")
    finally:
        double.stop()
    assert done.returncode == 0, done.stderr
    assert "mlx-community/tiny-pulled@" in done.stdout and "100.0%" in done.stderr
    assert listed(env)["mlx-community/tiny-pulled"]["quant"] == "f32"
    helped = here(env, "pull", "--help")
    assert "--revision" in helped.stdout and "Same as `hearth download`" in helped.stdout


def test_run_chats_over_a_pipe_and_fails_fast_on_an_unknown_model(env, server):
    # A random model decodes greedily to newlines; sampling hot shows text.
    script = "/set temperature 1.5\n/set seed 3\nHello\n/clear\n/bye\nnever sent\n"
    chat = hearth(env, "run", TINY_REPO, "--url", server.url, stdin=script)
    assert chat.returncode == 0, chat.stderr
    lines = chat.stdout.splitlines()
    assert lines[:2] == ["Set temperature to 1.5.", "Set seed to 3."] and "Cleared the conversation." in lines
    reply = "\n".join(lines[2:lines.index("Cleared the conversation.")])
    assert reply.strip(), chat.stdout
    assert "Traceback" not in chat.stderr

    unknown = hearth(env, "run", "hearth-test/nowhere", "--url", server.url, stdin="Hello\n")
    assert unknown.returncode == 1 and "hearth-test/nowhere" in unknown.stderr and "not found" in unknown.stderr

    remote = hearth(env, "run", TINY_REPO, "--url", "http://192.0.2.1:9", stdin="Hello\n")  # no server started
    assert remote.returncode == 1 and "no server at http://192.0.2.1:9" in remote.stderr
