"""One model's process: `hearth serve REF` on a private loopback port,
started by the router and reporting to it over a pipe.

The child writes one JSON object per line to the pipe (file descriptor
`HEARTH_ROUTER_FD`): `{"event": "stage", "stage": ..., "percent": ...}`
while it downloads and loads, `{"event": "ready", "port": N}` once it
listens. It answers only requests that carry the router's own key, and
stops when the router's process is gone. Its stderr is the router's, so
the operator sees every model's log in one place.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable

from core import procs

log = logging.getLogger("hearth.router")

FD_ENV = "HEARTH_ROUTER_FD"
MODEL_ENV = "HEARTH_ROUTER_MODEL"  # its log lines name the model
# Settings of the router that a child must not take as its own: the child
# answers only the router (its own key), on loopback, and forwards to no
# remote host. It keeps the Hub token (it may download its model) and the
# site's key (it is a process of the same site).
_NOT_INHERITED = (*procs.SERVER_KEYS, *procs.REMOTE_KEYS, "HEARTH_CORS_ORIGINS", "HEARTH_ALLOWED_HOSTS")


class ChildProcess:
    """A started child; `on_line(dict)` and `on_exit(code)` are called on a
    reader thread (the caller hands them to its event loop)."""

    def __init__(self, args: list[str], key: str, on_line: Callable[[dict], None],
                 on_exit: Callable[[int], None], name: str = ""):
        read_fd, write_fd = os.pipe()
        env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
        env.update({FD_ENV: str(write_fd), "HEARTH_API_KEY": key, MODEL_ENV: name})
        try:  # from the server's loop thread, which lives as long as the router (see `spawn`)
            self.proc = procs.spawn(procs.hearth_argv("serve", *args), env=env,
                                    on_parent_exit=signal.SIGTERM, pass_fds=(write_fd,),
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(write_fd)
        self.pid = self.proc.pid
        self._thread = threading.Thread(target=self._read, args=(read_fd, on_line, on_exit),
                                        name=f"router-child-{self.pid}", daemon=True)
        self._thread.start()

    def _read(self, fd: int, on_line, on_exit) -> None:
        with os.fdopen(fd, "rb") as pipe:
            for raw in pipe:  # EOF when the child (and any process it left the pipe to) is gone
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(line, dict):
                    on_line(line)
        on_exit(self.proc.wait())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> None:
        """Ask it to drain, flush its prompt cache to the SSD tier and exit."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def rss_bytes(self) -> int | None:
        """Its resident memory (Linux), or None."""
        return procs.proc_bytes(f"/proc/{self.pid}/status", "VmRSS")


# -- in the child ------------------------------------------------------------
def report(event: str, **fields) -> None:
    """Tell the router (when this process is a router's child)."""
    fd = os.environ.get(FD_ENV)
    if not fd:
        return
    try:
        os.write(int(fd), (json.dumps({"event": event, **fields}) + "\n").encode())
    except (OSError, ValueError):
        pass


def is_child() -> bool:
    return bool(os.environ.get(FD_ENV))

