"""`hearth run MODEL`: chat with a model in the terminal.

It talks to the server at `--url` (HEARTH_URL, else http://127.0.0.1:8080).
When nothing answers there on this machine, it starts `hearth serve` in
router mode on a free loopback port, with MODEL as its default model (its
output in HEARTH_HOME/logs/), waits for `/health`, and stops it on the way
out; that server runs in a session of its own, so Ctrl-C at the prompt
reaches this command only.

Before the first prompt it asks the server to load MODEL (`POST
/models/load`), so an unknown model fails at once with the server's
message. A single-model server refuses that route; then MODEL must be the
model it serves.

Then each line read is a user turn: it goes to `/v1/chat/completions` with
the whole conversation, streamed, and the reply prints as it arrives
(reasoning dimmed on a terminal). Ctrl-C stops a reply and keeps the
session; `/bye` or end of input leaves; `/help` lists the other commands
(sampling settings, a system message, `/clear`). Input that is not a
terminal works the same, a line per turn, with no prompt printed.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from django.core.management.base import BaseCommand

from chat import gensettings
from core import home, procs
from hub.management import remote
from inference.protocols import params

PROMPT = ">>> "
STARTUP_S = 300.0
STOP_S = 30.0
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
DIM, RESET = "\x1b[2m", "\x1b[0m"
# What `/set NAME VALUE` takes: the sampling fields every route reads, then max_tokens.
SETTINGS = {f.name: f.kind for f in (*params.FIELDS, gensettings.MAX_TOKENS)}
HELP = f"""Commands:
  /set NAME VALUE    a sampling setting for the next replies; NAME is one of
{textwrap.fill(", ".join(SETTINGS), width=78, initial_indent=" " * 21, subsequent_indent=" " * 21)}
  /set system TEXT   a system message for the conversation
  /clear             forget the conversation (the system message stays)
  /help              this list
  /bye               leave (Ctrl-D does too); Ctrl-C stops a reply
"""
ROOT = Path(__file__).resolve().parents[3]  # the folder that holds the `config` package


@contextlib.contextmanager
def spinner(text: str):
    """A spinner on a terminal's stderr, a dot a second elsewhere, while the block runs."""
    done = threading.Event()
    tty = sys.stderr.isatty()

    def spin():
        frames, tick = "|/-\\", 0
        while not done.wait(0.1 if tty else 1.0):
            sys.stderr.write(f"\r{frames[tick % 4]} {text}" if tty else ".")
            sys.stderr.flush()
            tick += 1

    if not tty:
        sys.stderr.write(text)
    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        sys.stderr.write("\r\x1b[K" if tty else "\n")
        sys.stderr.flush()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StartedServer:
    """`hearth serve` in router mode, started for this session with MODEL as
    its default (so it loads that at once, and builds no demo model), and
    stopped with the session."""

    def __init__(self, model: str, api_key: str | None):
        port = free_port()
        logs = home.logs()
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"run-serve-{port}.log"
        self.server = remote.Server(f"http://127.0.0.1:{port}", api_key)
        command = procs.hearth_argv("serve", "--port", str(port), "--default-model", model, "--no-worker")
        with open(self.log_path, "wb") as log:
            self.proc = procs.spawn(command, on_parent_exit=signal.SIGTERM, cwd=ROOT, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self) -> None:
        deadline, problem = time.monotonic() + STARTUP_S, None
        with spinner(f"starting a server on {self.server.url} (log: {self.log_path})"):
            while problem is None and not self.server.healthy(timeout=1.0):
                if self.proc.poll() is not None:
                    tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                    problem = f"exited {self.proc.returncode}: {tail[0]}"
                elif time.monotonic() > deadline:
                    problem = f"did not answer /health within {STARTUP_S:g} s"
                time.sleep(0.25)
        if problem:
            remote.fail("run", f"the server it started {problem} (log: {self.log_path})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # it drains, then stops the model processes it started
            try:
                self.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError):  # whatever it left behind in its session
            os.killpg(self.proc.pid, signal.SIGKILL)


def load(server: remote.Server, model: str) -> None:
    """Have the server load MODEL, or end the command with why it cannot."""
    refused = None
    try:
        with spinner(f"loading {model}"):
            server.request("POST", "/models/load", {"model": model}, timeout=None)
    except remote.NoServer as exc:
        remote.fail("run", str(exc))
    except remote.ServerError as exc:
        refused = exc
    if refused is None:
        return
    try:
        listing = server.models()
    except (remote.NoServer, remote.ServerError) as exc:
        remote.fail("run", str(exc))
    if refused.status not in (400, 404) or listing.get("mode") == "router":
        remote.fail("run", str(refused))
    # A single-model server: no loading; MODEL must be the one it serves.
    rows = listing.get("data") or []
    row = remote.find(rows, model)
    served = [r.get("id") for r in rows if remote.status_value(r) == "loaded"]
    if row is None:
        remote.fail("run", f"model '{model}' not found; the server at {server.url} serves {', '.join(served)}")
    if remote.status_value(row) != "loaded":
        remote.fail("run", f"the server at {server.url} serves only {', '.join(served)}; start `hearth serve` "
                           f"without a model (router mode) to chat with {model}")


def deltas(response: httpx.Response):
    """("reasoning" | "content", text) from an OpenAI chat stream; an error
    frame in the stream raises ServerError."""
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        if isinstance(chunk.get("error"), dict):
            raise remote.ServerError(str(chunk["error"].get("message") or chunk["error"]), response.status_code)
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if thought:
                yield "reasoning", thought
            if delta.get("content"):
                yield "content", delta["content"]


class Printer:
    """Writes a reply as it streams: reasoning framed (and dimmed on a terminal), then the answer."""

    def __init__(self, tty: bool):
        self.tty, self.thinking, self.last = tty, False, "\n"

    def write(self, kind: str, text: str) -> None:
        if kind == "reasoning" and not self.thinking:
            self._out((DIM if self.tty else "") + "Thinking...\n")
            self.thinking = True
        elif kind == "content" and self.thinking:
            self._close_thinking()
        self._out(text)

    def _close_thinking(self) -> None:
        self._out(("" if self.last == "\n" else "\n") + "...done thinking.\n\n" + (RESET if self.tty else ""))
        self.thinking = False

    def end(self) -> None:
        if self.thinking:
            self._close_thinking()
        if self.last != "\n":
            self._out("\n")
        if self.tty:
            self._out("\n")

    def _out(self, text: str) -> None:
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
            self.last = text[-1]


class Chat:
    def __init__(self, server: remote.Server, model: str, tty: bool):
        self.server, self.model, self.tty = server, model, tty
        self.history: list[dict] = []
        self.system: str | None = None
        self.settings: dict = {}

    def command(self, line: str) -> bool:
        """Run a /command; False when it ends the session."""
        name, _, rest = line.partition(" ")
        if name in ("/bye", "/exit"):
            return False
        if name == "/clear":
            self.history.clear()
            self.say("Cleared the conversation.")
        elif name in ("/help", "/?"):
            self.say(HELP.rstrip())
        elif name == "/set":
            self.set(rest.strip())
        else:
            self.say(f"Unknown command {name}; /help lists the commands.")
        return True

    def set(self, text: str) -> None:
        key, _, value = text.partition(" ")
        value = value.strip()
        if key == "system":
            self.system = value or None
            self.say("Set the system message." if value else "Cleared the system message.")
        elif key in SETTINGS and value:
            try:
                self.settings[key] = SETTINGS[key](value)
            except ValueError:
                self.say(f"{key} takes {'a whole number' if SETTINGS[key] is int else 'a number'}, not {value!r}.")
                return
            self.say(f"Set {key} to {value}.")
        else:
            self.say(f"Usage: /set {'|'.join([*SETTINGS, 'system'])} VALUE")

    def say(self, text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def turn(self, text: str) -> None:
        """Send a user turn and stream the reply; the turn stays in the
        history with what arrived of the reply, unless nothing did."""
        self.history.append({"role": "user", "content": text})
        system = [{"role": "system", "content": self.system}] if self.system else []
        body = {"model": self.model, "messages": system + self.history, "stream": True, **self.settings}
        printer, content = Printer(self.tty), []
        try:
            with httpx.stream("POST", self.server.url + "/v1/chat/completions", json=body,
                              headers=self.server.headers, timeout=httpx.Timeout(10.0, read=None)) as response:
                if response.status_code >= 400:
                    response.read()
                    raise remote.ServerError(remote.error_message(response), response.status_code)
                for kind, delta in deltas(response):
                    printer.write(kind, delta)
                    if kind == "content":
                        content.append(delta)
        except KeyboardInterrupt:  # leaving the `with` closes the stream, which stops the generation
            printer.end()
        except remote.ServerError as exc:
            printer.end()
            sys.stderr.write(f"hearth run: {exc}\n")
        except httpx.TransportError as exc:
            printer.end()
            remote.fail("run", f"lost the server at {self.server.url}: {exc}")
        else:
            printer.end()
        if content:
            self.history.append({"role": "assistant", "content": "".join(content)})
        else:
            self.history.pop()


def lines(tty: bool):
    """The user's lines: from a prompt with line editing and history on a
    terminal, else from stdin as it comes."""
    if not tty:
        for line in sys.stdin:
            yield line.rstrip("\r\n")
        return
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  input() gains line editing and history
    while True:
        try:
            yield input(PROMPT)
        except KeyboardInterrupt:
            sys.stdout.write("\nUse Ctrl-D or /bye to leave.\n")
        except EOFError:
            sys.stdout.write("\n")
            return


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in LOOPBACK or host.startswith("127.")


class Command(BaseCommand):
    help = "Chat with a model in the terminal (starts a server in router mode when none is running)."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("model", help="a model id (org/name) or alias the server knows; `hearth ls` lists them")
        remote.add_arguments(parser)

    def handle(self, *args, **opts):
        server = remote.Server.from_options(opts)
        started = None
        # SIGTERM and SIGHUP unwind like Ctrl-D, so a server this command started is stopped.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda number, _frame: sys.exit(128 + number))
        try:
            if not server.healthy():
                if not is_loopback(server.url):
                    remote.fail("run", f"no server at {server.url}")
                sys.stderr.write(f"hearth run: no server at {server.url}; starting one\n")
                started = StartedServer(opts["model"], server.api_key)
                server = started.server
                started.wait_ready()
            load(server, opts["model"])
            chat = Chat(server, opts["model"], sys.stdin.isatty() and sys.stdout.isatty())
            for line in lines(sys.stdin.isatty()):
                text = line.strip()
                if text.startswith("/"):
                    if not chat.command(text):
                        break
                elif text:
                    chat.turn(line)
        except KeyboardInterrupt:
            sys.stderr.write("\n")
            sys.exit(130)
        finally:
            if started is not None:
                started.stop()
