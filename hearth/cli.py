"""The `hearth` command line: Hearth's own commands, one line of help each,
and Django's commands behind `hearth django`. `manage.py` is Django's
usual flat command line over the same commands.

Hearth's commands are the management commands of Hearth's own apps, found
at run time, so a command added to an app is listed without being named
here. Two of Django's commands are refused on both command lines because
they look like ways to run Hearth and are not: `runserver` starts the site
without the engine, `run_huey` consumes the queue without the worker's
zombie handling.

MLX's Linux CPU wheel links the reference BLAS, several times slower than
OpenBLAS or MKL for float32 matmuls. The dynamic loader only honours
LD_PRELOAD at process start, so both command lines re-execute themselves
once with the library core.blas chooses (measured at the first start on a
machine, or named with `--blas NAME` / HEARTH_BLAS) preloaded; every child
they spawn (the job worker, router-mode engines, job runners) inherits it.
`--blas` is taken off the command line wherever it stands, before the
command sees its arguments.
"""
from __future__ import annotations

import os
import sys
from difflib import get_close_matches

from core import blas, device, procs, torchless
from core.home import blas_cache

# The top-level packages whose apps' management commands are Hearth's.
HEARTH_PACKAGES = frozenset({"core", "inference", "hub", "serving", "jobs", "chat", "memory", "hearth", "config"})
REFUSED = {
    "runserver": "it starts the site without the engine, so no model is loaded and /v1 cannot answer, and "
                 "without the job worker. Run `hearth serve [MODEL]` instead: it loads the model, starts the "
                 "worker and drains requests on shutdown.",
    "run_huey": "it consumes the job queue without Hearth's worker setup, so jobs left running by a dead worker "
                "are never marked zombie and lost queue entries are never queued again. Run `hearth worker` "
                "instead, or let `hearth serve` start one.",
}
EXIT_USAGE = 2


# Commands that run no MLX: they start without choosing a BLAS (`blas` measures in its own children). The
# library's commands only read and write the HF cache or ask a server: on a new home, measuring first made
# `hearth ls` wait 15 s for work it did not need.
NO_BLAS = frozenset({"help", "--help", "-h", "--version", "version", "blas", "ls", "ps", "rm", "gc", "download",
                     "pull"})


class UsageError(Exception):
    pass


def take_blas_option(argv: list[str]) -> tuple[list[str], str | None]:
    """`argv` without `--blas NAME` / `--blas=NAME`, and NAME (the last one given)."""
    rest: list[str] = []
    chosen = None
    items = iter(argv)
    for arg in items:
        if arg == "--blas":
            chosen = next(items, None)
            if chosen is None:
                raise UsageError(f"--blas needs one of {', '.join(blas.CHOICES)}")
        elif arg.startswith("--blas="):
            chosen = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if chosen is not None and chosen.lower() not in blas.CHOICES:
        raise UsageError(f"--blas must be one of {', '.join(blas.CHOICES)}, not {chosen!r}")
    return rest, chosen.lower() if chosen is not None else None


def _say(line: str) -> None:
    sys.stderr.write(f"hearth: {line}\n")
    sys.stderr.flush()


def _reexec_with_blas(command: list[str], argv: list[str], option: str | None) -> None:
    """Start this process again as `python COMMAND` with the chosen BLAS preloaded."""
    if sys.platform != "linux" or os.environ.get("_HEARTH_REEXEC"):
        return
    if not argv or argv[0] in NO_BLAS or "--help" in argv or "-h" in argv:
        return
    if device.gpu_expected() and not option and "HEARTH_BLAS" not in os.environ:
        return  # MLX computes on the GPU: no CPU BLAS to measure or preload (unless one is named)
    requested = option or os.environ.get("HEARTH_BLAS", "").strip().lower() or "auto"
    try:
        choice = blas.choose(requested, "option" if option else "env", blas_cache(), say=_say)
    except ValueError as exc:
        raise UsageError(f"HEARTH_BLAS {exc}") from None
    if choice.note:
        _say(choice.note)
    if choice.measured:
        _say(f"using {choice.candidate.label}")
    env = blas.launch_env(choice, dict(os.environ))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *command], env)


def _start(argv: list[str], command: list[str], prog: str) -> list[str] | None:
    """Take `--blas` off `argv` and re-execute with the BLAS chosen; the
    arguments left, or None after a usage error (printed)."""
    try:
        argv, option = take_blas_option(argv)
        _reexec_with_blas([*command, *argv], argv, option)
    except UsageError as exc:
        sys.stderr.write(f"{prog}: {exc}\n")
        return None
    return argv


def _settings_loaded(prog: str) -> bool:
    """Load the settings; a bad environment value or a missing optional
    package is one line on stderr, not a traceback."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    from core.env import SettingError

    try:
        settings.INSTALLED_APPS  # noqa: B018  reading it loads the settings module
    except (SettingError, ImproperlyConfigured) as exc:
        sys.stderr.write(f"{prog}: {exc}\n")
        return False
    return True


def refusal(name: str, prog: str) -> str:
    """Why `name` does not run, and what to run instead."""
    return f"{prog}: `{name}` does not run Hearth: {REFUSED[name]}\n"


def hearth_commands() -> dict[str, tuple[str, str]]:
    """Hearth's commands as shown (dashes for underscores) -> (app, Django's name)."""
    from django.core.management import get_commands

    found = {name.replace("_", "-"): (app, name) for name, app in get_commands().items()
             if isinstance(app, str) and app.split(".")[0] in HEARTH_PACKAGES}
    return dict(sorted(found.items(), key=lambda item: (item[0] != "serve", item[0])))


def _summary(app: str, name: str) -> str:
    from django.core.management import load_command_class

    text = (load_command_class(app, name).help or "").strip()
    return text.splitlines()[0] if text else ""


def listing(prog: str = "hearth") -> str:
    commands = hearth_commands()
    rows = [(shown, _summary(app, name)) for shown, (app, name) in commands.items()]
    rows.append(("django", f"Django's own commands, e.g. `{prog} django migrate` (`{prog} django help` lists them)"))
    width = max(len(shown) for shown, _ in rows)
    lines = [f"usage: {prog} <command> [options]", "",
             "Hearth: a local LLM platform on MLX, serving the OpenAI, Anthropic and Responses protocols.", "",
             "commands:"]
    lines += [f"  {shown:<{width}}  {summary}" for shown, summary in rows]
    lines += ["", f"`{prog} <command> --help` shows a command's options. Every command also takes "
              f"--blas {{{','.join(blas.CHOICES)}}}: the BLAS MLX runs on (default auto: the fastest measured "
              f"here; `{prog} blas` shows the measurement)."]
    return "\n".join(lines) + "\n"


def _unknown(name: str, prog: str) -> int:
    from django.core.management import get_commands

    message = f"{prog}: unknown command {name!r}."
    if name in get_commands():
        message += f" Django's commands run as `{prog} django {name}`."
    else:
        close = get_close_matches(name, [*hearth_commands(), "django"], n=1)
        if close:
            message += f" Did you mean `{prog} {close[0]}`?"
    sys.stderr.write(f"{message}\n\n{listing(prog)}")
    return EXIT_USAGE


def _django_utility(argv: list[str], hidden: frozenset[str] = frozenset()):
    """Django's ManagementUtility that refuses REFUSED and leaves them and
    `hidden` (app names) out of its listing."""
    from collections import defaultdict

    from django.core.management import ManagementUtility, get_commands

    class Utility(ManagementUtility):
        def main_help_text(self, commands_only=False):
            names: dict[str, list[str]] = defaultdict(list)
            for name, app in get_commands().items():
                if name not in REFUSED and (not isinstance(app, str) or app.split(".")[0] not in hidden):
                    names["django" if app == "django.core" else str(app).rpartition(".")[-1]].append(name)
            if commands_only:
                return "\n".join(sorted(n for group in names.values() for n in group))
            lines = ["", f"Type '{self.prog_name} help <subcommand>' for help on a specific subcommand.", "",
                     "Available subcommands:"]
            for app in sorted(names):
                lines += ["", f"[{app}]", *(f"    {name}" for name in sorted(names[app]))]
            return "\n".join(lines)

        def fetch_command(self, subcommand):
            if subcommand in REFUSED:
                sys.stderr.write(refusal(subcommand, self.prog_name))
                sys.exit(EXIT_USAGE)
            return super().fetch_command(subcommand)

    return Utility(argv)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hearth")
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None, prog: str = "hearth") -> int:
    """The `hearth` console script."""
    started = _start(list(sys.argv[1:] if argv is None else argv), procs.hearth_argv()[1:], prog)
    if started is None:
        return EXIT_USAGE
    argv = started
    procs.tie_to_spawner()  # after the BLAS re-exec: a process Hearth started ends with its parent
    torchless.install()  # transformers without torch: about 2 s off every start (core/torchless.py)
    if argv in (["--version"], ["version"]):
        sys.stdout.write(f"{prog} {_version()}\n")
        return 0
    if not _settings_loaded(prog):
        return EXIT_USAGE
    if len(argv) > 1 and argv[0] == "help":  # `hearth help serve` is `hearth serve --help`
        argv = [argv[1], "--help"]
    if argv and argv[0] == "django":
        _django_utility([f"{prog} django", *argv[1:]], hidden=HEARTH_PACKAGES).execute()
        return 0
    import django

    django.setup()
    if not argv or argv[0] in ("help", "--help", "-h"):
        sys.stdout.write(listing(prog))
        return 0
    name = argv[0].replace("_", "-")
    if name.replace("-", "_") in REFUSED:
        sys.stderr.write(refusal(name.replace("-", "_"), prog))
        return EXIT_USAGE
    commands = hearth_commands()
    if name not in commands:
        return _unknown(argv[0], prog)
    from django.core.management import load_command_class

    app, django_name = commands[name]
    load_command_class(app, django_name).run_from_argv([prog, name, *argv[1:]])
    return 0


def manage(argv: list[str] | None = None, script: str = "manage.py") -> int:
    """`python manage.py`: Django's flat command line over every command,
    Hearth's included, with the same preload and refusals as `hearth`."""
    prog = os.path.basename(script)
    started = _start(list(sys.argv[1:] if argv is None else argv), [os.path.abspath(script)], prog)
    if started is None:
        return EXIT_USAGE
    argv = started
    procs.tie_to_spawner()  # after the BLAS re-exec: a process Hearth started ends with its parent
    if not _settings_loaded(prog):
        return EXIT_USAGE
    _django_utility([prog, *argv]).execute()
    return 0


if __name__ == "__main__":
    sys.exit(main())
