"""The `hearth` console script and `manage.py`: Hearth's commands listed
with one line each, a command's own help, Django's commands behind `hearth
django`, the refused `runserver` and `run_huey`, unknown commands, and
settings that stop start-up with one line. Each entry point runs as a real
process where the process is what is tested (its exit code, the BLAS
restart, the settings it loads, a port, a home); what only prints and
returns runs through the same function in this process (`here`)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, server_env

SCRIPT = str(Path(sys.executable).with_name("hearth"))  # the installed console script
COMMANDS = {  # each command and a phrase of its one line of help
    "serve": "Serve every model in the library",
    "worker": "Run a job worker",
    "download": "Download a model repo",
    "gc": "Reclaim disk",
    "pull": "Same as `hearth download`",
    "ls": "List the local models",
    "ps": "List the models a running server has loaded",
    "rm": "Remove a model repo",
    "run": "Chat with a model in the terminal",
    "memory": "Memory vaults",
    "make-demo-model": "Train the small demo chat model",
    "generate-sharded": "sharded across the ranks mlx.launch started",
    "django": "Django's own commands",
}


@pytest.fixture
def env(tmp_path):
    return server_env(tmp_path / "hf", tmp_path / "hearth")


def run(env, *args: str, program: tuple[str, ...] = (SCRIPT,), timeout: float = 120):
    # A refused `runserver` that ran anyway would serve until this timeout.
    return subprocess.run([*program, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def here(capsys, monkeypatch, *args: str, manage: bool = False) -> subprocess.CompletedProcess:
    """`hearth ARGS` (or `manage.py ARGS`) through the function the console script (manage.py)
    calls, in this process: its exit code and what it printed. A Django process costs a CPU-second
    to start; these commands only parse their arguments and print."""
    from hearth import cli

    monkeypatch.setenv("_HEARTH_REEXEC", "1")  # the BLAS restart would replace this process
    capsys.readouterr()
    try:
        code = cli.manage(list(args), script=str(ROOT / "manage.py")) if manage else cli.main(list(args))
    except SystemExit as exc:  # argparse's --help and Django's refusals exit
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def command_rows(text: str) -> dict[str, str]:
    rows = text.split("commands:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return {name: help_.strip() for name, _, help_ in (row.strip().partition(" ") for row in rows)}


def test_hearth_lists_its_commands_with_one_line_each(env, capsys, monkeypatch):
    shown = run(env, "--help")  # the installed console script
    assert shown.returncode == 0, shown.stderr
    rows = command_rows(shown.stdout)
    assert set(COMMANDS) <= set(rows)
    assert (next(iter(rows)), list(rows)[-1]) == ("serve", "django")
    for name, phrase in COMMANDS.items():
        assert phrase in rows[name], (name, rows[name])
    # Django's own list stays behind `hearth django`.
    for name in ("runserver", "run_huey", "migrate", "createsuperuser", "collectstatic", "shell"):
        assert name not in rows
    for args in ((), ("help",)):
        again = here(capsys, monkeypatch, *args)
        assert (again.returncode, again.stdout) == (0, shown.stdout), args


def test_a_commands_own_help(env, capsys, monkeypatch):
    demo = here(capsys, monkeypatch, "make-demo-model", "--help")
    assert demo.returncode == 0, demo.stderr
    assert demo.stdout.startswith("usage: hearth make-demo-model ")
    assert "--force" in demo.stdout and "--steps" in demo.stdout
    vision = run(env, "make-demo-model", "--kind", "vision", "--background")  # refused, not ignored
    assert vision.returncode == 1 and "--background is for the chat and speech models" in vision.stderr, vision
    serve = here(capsys, monkeypatch, "help", "serve")
    assert serve.returncode == 0, serve.stderr
    assert serve.stdout.startswith("usage: hearth serve ")
    assert "--max-context" in serve.stdout and "--api-key" in serve.stdout


def test_django_commands_run_behind_one_subcommand(env, capsys, monkeypatch):
    listed = here(capsys, monkeypatch, "django", "help")
    assert listed.returncode == 0, listed.stderr
    names = set(listed.stdout.split())
    assert {"migrate", "createsuperuser", "showmigrations", "check", "dbshell"} <= names
    assert not names & {"runserver", "run_huey", "serve", "worker", "gc", "make_demo_model"}
    assert "Type 'hearth django help <subcommand>'" in listed.stdout

    migrated = run(env, "django", "migrate", "jobs")  # processes: into the home of `env`
    assert migrated.returncode == 0, migrated.stderr
    shown = run(env, "django", "showmigrations", "jobs")
    assert shown.returncode == 0, shown.stderr
    assert "[X] 0001_initial" in shown.stdout
    assert (Path(env["HEARTH_HOME"]) / "hearth.sqlite3").is_file()

    helped = here(capsys, monkeypatch, "django", "migrate", "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: hearth django migrate ")


@pytest.mark.parametrize(("args", "program", "instead", "why"), [
    (("django", "runserver", "--noreload"), (SCRIPT,), "hearth serve", "without the engine"),
    (("runserver", "--noreload"), (SCRIPT,), "hearth serve", "without the engine"),
    (("django", "run_huey"), (SCRIPT,), "hearth worker", "marked zombie"),
    (("runserver", "--noreload"), (sys.executable, "manage.py"), "hearth serve", "without the engine"),
    (("run_huey",), (sys.executable, "manage.py"), "hearth worker", "marked zombie"),
])
def test_runserver_and_run_huey_are_refused(env, args, program, instead, why):
    done = run(env, *args, program=program, timeout=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert instead in done.stderr and why in done.stderr
    assert "does not run Hearth" in done.stderr
    assert "Traceback" not in done.stderr


def test_help_on_a_refused_command_is_refused(capsys, monkeypatch):
    done = here(capsys, monkeypatch, "django", "help", "run_huey")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "hearth worker" in done.stderr and "marked zombie" in done.stderr
    assert "does not run Hearth" in done.stderr


def test_an_unknown_command_is_an_error_that_lists_the_commands(capsys, monkeypatch):
    done = here(capsys, monkeypatch, "frobnicate")
    assert done.returncode == 2
    assert "unknown command 'frobnicate'" in done.stderr
    assert set(COMMANDS) <= set(command_rows(done.stderr))
    assert done.stdout == ""
    migrate = here(capsys, monkeypatch, "migrate")
    assert migrate.returncode == 2
    assert "Django's commands run as `hearth django migrate`" in migrate.stderr


def test_manage_py_is_djangos_flat_command_line_over_the_same_commands(capsys, monkeypatch):
    listed = here(capsys, monkeypatch, "help", manage=True)
    assert listed.returncode == 0, listed.stderr
    names = set(listed.stdout.split())
    assert {"serve", "worker", "make_demo_model", "migrate", "createsuperuser"} <= names
    assert not names & {"runserver", "run_huey"}
    serve = here(capsys, monkeypatch, "serve", "--help", manage=True)
    assert serve.returncode == 0, serve.stderr
    assert serve.stdout.startswith("usage: manage.py serve ")


@pytest.mark.parametrize(("variables", "message"), [
    ({"HEARTH_REDIS_URL": "redis://127.0.0.1:1/0"}, "pip install 'hearth[redis]'"),
    ({"HEARTH_DEBUG": "maybe"}, "HEARTH_DEBUG='maybe' is not a boolean"),
])
def test_a_bad_setting_stops_start_up_with_one_line(env, tmp_path, variables, message):
    # A `redis` package that fails to import, as when the extra is not installed.
    absent = tmp_path / "absent"
    (absent / "redis").mkdir(parents=True)
    (absent / "redis" / "__init__.py").write_text("raise ImportError(\"No module named 'redis'\")\n")
    env = dict(env, PYTHONPATH=str(absent), **variables)
    done = run(env, "django", "check")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr
    assert done.stderr.startswith("hearth: ") and done.stderr.count("\n") == 1


def test_serve_on_a_port_in_use_stops_before_starting_anything(env):
    """Another program listens on the port: `hearth serve` says so and exits 1, before the
    worker, a demo build or a model is started (daphne's own bind would only stop the reactor)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run(env, "serve", "--port", str(port), "--build-demo")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"cannot listen on 127.0.0.1:{port} (Address already in use)" in done.stderr
    assert "--port N (make serve PORT=N)" in done.stderr
    assert "worker" not in done.stderr.lower() and "demo" not in done.stderr.lower(), done.stderr


def test_commands_run_from_a_folder_that_holds_a_hearth_folder(env, tmp_path):
    """Run where the working directory holds a `hearth/` folder (here the HEARTH_HOME of `env`, as
    `HEARTH_HOME=$PWD/hearth` makes it; or the clone itself, seen from its parent): `hearth serve` is
    still Hearth's command. The restart with the BLAS preloaded (`python -m hearth.cli`) took that
    empty folder for the package, and `serve`, `run` and `blas` were 'unknown command'."""
    import socket

    (tmp_path / "hearth").mkdir()
    assert env["HEARTH_HOME"] == str(tmp_path / "hearth")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([SCRIPT, "serve", "--port", str(port)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "unknown command" not in done.stderr and f"cannot listen on 127.0.0.1:{port}" in done.stderr, done.stderr


def test_the_librarys_commands_start_without_measuring_the_blas(env):
    """`hearth ls`, `ps`, `rm`, `gc`, `download` and `pull` run no MLX: on a home that has not chosen a BLAS
    yet they answer at once, instead of measuring every library first (15 s on 2 cores) and writing the pick."""
    env = {k: v for k, v in env.items() if k != "HEARTH_BLAS"}  # the suite names one: none named here
    for args in (["ls"], ["ps", "--url", "http://127.0.0.1:9"]):
        done = run(env, *args)
        assert "measur" not in (done.stdout + done.stderr).lower(), (args, done.stdout, done.stderr)
    assert not (Path(env["HEARTH_HOME"]) / "blas.json").exists()
