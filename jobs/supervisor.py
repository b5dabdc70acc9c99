"""`hearth serve` keeps one `hearth worker` process alive beside it."""
from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time

log = logging.getLogger("hearth.jobs")
RESTART_DELAY_S = 1.0


class WorkerSupervisor:
    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hearth-worker-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _spawn(self) -> subprocess.Popen:
        # The CLI module, so the worker gets the same BLAS preload as the server.
        return subprocess.Popen([sys.executable, "-m", "config.cli", "worker"])

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.proc = self._spawn()
            log.info("job worker started (pid %d)", self.proc.pid)
            code = self.proc.wait()
            if self._stopping.is_set():
                return
            self.restarts += 1
            log.warning("job worker exited with %s; restarting", code)
            time.sleep(RESTART_DELAY_S)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
