"""A real PostgreSQL server for the tests, from Debian's packages (`make
postgres` installs them): a cluster in a temporary folder, on a free
loopback port, its unix socket in that folder, stopped and removed at the end.

initdb and the server refuse to run as root; a root test run hands the
folder to the `postgres` user (or `nobody`) and runs them as that user."""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.helpers import free_port

USER, PASSWORD = "hearth", "hearth-test-pw"


def find_bin(name: str) -> str | None:
    """`initdb` / `pg_ctl` of the newest installed version (Debian keeps them
    off PATH, in /usr/lib/postgresql/<version>/bin)."""
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/" + name),
                      key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    return versions[-1] if versions else shutil.which(name)


def _server_user() -> str | None:
    """The user the server runs as: None for this one, unless this is root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root, and neither a postgres nor a nobody user exists to run PostgreSQL as")


class Postgres:
    def __init__(self) -> None:
        initdb, self.pg_ctl = find_bin("initdb"), find_bin("pg_ctl")
        if not initdb or not self.pg_ctl:
            raise RuntimeError("PostgreSQL is not installed (make postgres, or apt-get install postgresql)")
        self.user = _server_user()
        self.dir = Path(tempfile.mkdtemp(prefix="hearth-pg-"))  # not under the 0700 session folder: root's
        self.data, self.log = self.dir / "data", self.dir / "server.log"
        pwfile = self.dir / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self.user:
            ids = pwd.getpwnam(self.user)
            os.chown(self.dir, ids.pw_uid, ids.pw_gid)
            os.chown(pwfile, ids.pw_uid, ids.pw_gid)
        self._run(initdb, "-D", str(self.data), "-U", USER, "--pwfile", str(pwfile), "--auth-local=trust",
                  "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
        self.port = free_port()
        # A throwaway cluster: no fsync, so the suite waits on nothing.
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")

    def _run(self, *argv: str) -> None:
        command = ["runuser", "-u", self.user, "--", *argv] if self.user else list(argv)
        done = subprocess.run(command, cwd=self.dir, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({done.returncode}):\n{done.stdout}{done.stderr}{log}")

    def url(self, database: str) -> str:
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def query(self, database: str, sql: str, params: tuple = ()) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.url(database)) as conn:
            return conn.execute(sql, params).fetchall()

    def stop(self) -> None:
        try:
            self._run(self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
