"""A real PostgreSQL server for the tests and the benchmark: Debian's ``postgresql`` package,
started in a temp dir.

``initdb`` and ``pg_ctl`` from the system (tests/prepare.py installs the package), a cluster in a
fresh directory, listening on a unix socket only (``listen_addresses=''``: nothing on the network),
trust authentication for its one user. PostgreSQL refuses to run as root, so as root it runs as the
package's ``postgres`` user. ``fsync=off``: a test server's data outlives a killed postmaster (the
page cache keeps it), only a machine crash would lose it, and every test starts from an empty
database anyway.

    server = PgServer.start(root)     # ~1 s
    url = server.new_database()       # postgresql://cao@/t_…?host=…&port=…  (CREATE DATABASE: ~50 ms)
    server.restart() / server.kill()  # the restart and crash scenarios
    server.stop()
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PORT = 5432  # a unix socket's name only: nothing listens on TCP


def binaries() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name)
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def missing_reason() -> str | None:
    """Why no test server can start here (None: it can)."""
    if binaries() is None:
        return "PostgreSQL is not installed (python -m tests.prepare installs Debian's postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the server as"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[dev]')"
    return None


@dataclass
class PgServer:
    root: Path
    bin: Path
    user: str | None  # the system user it runs as (None: this one)
    # the multi-host lab (tests/netlab.py): run in this namespace, also listening on this address
    netns: list[str] | None = None
    listen: str | None = None

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def sockets(self) -> Path:
        return self.root / "sock"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://cao@/{database}?host={self.sockets}&port={PORT}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        if self.netns is not None:
            cmd = [*self.netns, *cmd]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        return subprocess.run(cmd, check=check, capture_output=True, text=True, env=env, cwd=self.root)

    @classmethod
    def start(
        cls,
        root: Path,
        *,
        netns: list[str] | None = None,
        listen: str | None = None,
        trust: str | None = None,
    ) -> PgServer:
        """``netns``/``listen``/``trust``: the lab's hub namespace, its address, the subnet
        whose clients it trusts (tests/netlab.py); by default a unix socket only."""
        bindir = binaries()
        assert bindir is not None, missing_reason()
        root.mkdir(parents=True, exist_ok=True)
        user = "postgres" if os.geteuid() == 0 else None
        server = cls(root=root, bin=bindir, user=user, netns=netns, listen=listen)
        server.sockets.mkdir(exist_ok=True)
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chmod(root, 0o755)
            for path in (root, server.sockets):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        server._run(
            str(bindir / "initdb"),
            "-D",
            str(server.data),
            "-U",
            "cao",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        )
        if trust is not None:
            with open(server.data / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {trust} trust\n")
        server._start()
        return server

    def _start(self) -> None:
        options = (
            f"-k {self.sockets} -c listen_addresses='{self.listen or ''}' -p {PORT} -c fsync=off "
            "-c synchronous_commit=off "
            "-c full_page_writes=off -c max_connections=300 -c shared_buffers=32MB"
        )
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-o",
            options,
            "-w",
            "-t",
            "30",
            "start",
        )

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def sql(self, statement: str, database: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            conn.execute(statement)

    def new_database(self) -> str:
        name = f"t_{secrets.token_hex(5)}"
        self.sql(f"CREATE DATABASE {name}")
        return self.url(name)

    def drop_database(self, url: str) -> None:
        name = url.split("/")[3].split("?")[0]
        self.sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def restart(self) -> None:
        """A clean restart: every connection is dropped, the data stays."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        self._start()

    def stop(self) -> None:
        done = self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False
        )
        if done.returncode != 0 and (pid := self.pid()) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
