"""System services some end-to-end tests need: a Docker daemon, a PostgreSQL server, and a webhook receiver.

Each is used when it already runs, started by the test session when it can be (as root, from Debian's packages that
`scripts/test.sh` installs), stopped again at the end, and otherwise the tests that need it are skipped with the
reason and the fix."""

from __future__ import annotations

import glob
import http.server
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from tbench.node.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
SETUP_HINT = "scripts/test.sh installs it from Debian's packages when it runs as root"


class Unavailable(Exception):
    """Why a service cannot run here: the tests that need it are skipped with this reason."""


def _wait(check, timeout_s: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-1500:] if log and log.exists() else ""
    raise RuntimeError(f"{what} did not come up within {timeout_s:.0f} s\n{tail}")


def _docker_ok(env: dict[str, str]) -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, env=env).returncode == 0


@contextmanager
def docker_daemon():
    """Yields the environment the docker CLI reaches a daemon with: the machine's own daemon, or one this session
    starts (its own socket and state, Debian's dockerd with the flags this sandbox allows) and stops at the end."""
    if not shutil.which("docker"):
        raise Unavailable(f"no docker CLI ({SETUP_HINT})")
    if _docker_ok(dict(os.environ)):
        yield {}
        return
    if os.geteuid() != 0:
        raise Unavailable("no Docker daemon is reachable and only root can start one (run the tests as root)")
    if not shutil.which("dockerd"):
        raise Unavailable(f"no dockerd ({SETUP_HINT}: docker.io)")
    state = Path(tempfile.mkdtemp(prefix="tbench-dockerd-"))
    env = {"DOCKER_HOST": f"unix://{state}/docker.sock"}
    log = state / "dockerd.log"
    # no iptables here; vfs works on any filesystem; images and containers go with the state folder at the end
    argv = [
        "dockerd",
        "--iptables=false",
        "--storage-driver=vfs",
        f"--host={env['DOCKER_HOST']}",
        f"--data-root={state}/data",
        f"--exec-root={state}/exec",
        f"--pidfile={state}/docker.pid",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(lambda: proc.poll() is None and _docker_ok({**os.environ, **env}), 60, "dockerd", log)
        yield env
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _unmount_under(state)  # dockerd leaves its network namespace mounted in exec-root
        shutil.rmtree(state, ignore_errors=True)


def _unmount_under(folder: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines() if len(line.split()) > 1]
    for mount in sorted((m for m in mounts if m.startswith(f"{folder}/")), reverse=True):
        subprocess.run(["umount", "--lazy", mount], capture_output=True)


def cpu_image(env: dict[str, str]) -> str:
    """The Triton image infra/build_cpu_image.py builds from this machine's files (built once per content)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "infra" / "build_cpu_image.py")],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"building the CPU Triton image failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def _postgres_bin(name: str) -> str | None:
    found = shutil.which(name)
    return found or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)


@contextmanager
def postgres_server(user: str = "tbench", password: str = "s3cret-pw", database: str = "prefect"):
    """A throwaway PostgreSQL cluster on a free loopback port; yields its SQLAlchemy URL for Prefect (asyncpg)."""
    initdb, pg_ctl = _postgres_bin("initdb"), _postgres_bin("pg_ctl")
    if not initdb or not pg_ctl:
        raise Unavailable(f"no PostgreSQL server binaries (initdb, pg_ctl; {SETUP_HINT}: postgresql)")
    run_as: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            raise Unavailable("running as root without a 'postgres' user to run PostgreSQL as") from None
        run_as = ["runuser", "-u", "postgres", "--"]
    folder = Path(tempfile.mkdtemp(prefix="tbench-pg-"))
    if run_as:
        os.chown(folder, owner.pw_uid, owner.pw_gid)
    data, port, log = folder / "data", free_port(), folder / "postgres.log"
    pw_file = folder / "pw"
    pw_file.write_text(password + "\n")
    if run_as:
        os.chown(pw_file, owner.pw_uid, owner.pw_gid)

    def as_owner(argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run([*run_as, *argv], capture_output=True, text=True, **kw)

    done = as_owner([initdb, "-D", str(data), "-U", user, "--auth=scram-sha-256", f"--pwfile={pw_file}", "-E", "UTF8"])
    if done.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {done.stderr[-2000:]}")
    started = as_owner(
        [
            pg_ctl,
            "-D",
            str(data),
            "-l",
            str(log),
            "-w",
            "-t",
            "60",
            "-o",
            f"-p {port} -k {folder} -c listen_addresses=127.0.0.1",
            "start",
        ]
    )
    try:
        if started.returncode != 0:
            raise RuntimeError(
                f"pg_ctl start failed: {started.stderr[-2000:]} {log.read_text()[-1500:] if log.exists() else ''}"
            )
        created = as_owner(
            [_postgres_bin("createdb") or "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", user, database],
            env={**os.environ, "PGPASSWORD": password},
        )
        if created.returncode != 0:
            raise RuntimeError(f"createdb failed: {created.stderr[-2000:]}")
        yield f"postgresql+asyncpg://{user}:{password}@127.0.0.1:{port}/{database}"
    finally:
        as_owner([pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"])
        shutil.rmtree(folder, ignore_errors=True)


class WebhookReceiver(http.server.ThreadingHTTPServer):
    """The team's chat: a local HTTP endpoint that keeps the JSON bodies posted to it (`received`)."""

    def __init__(self):
        self.received: list[dict] = []
        received = self.received

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the stdlib's name
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"

    def wait(self, timeout_s: float = 60) -> list[dict]:
        """What was posted, once something was or the time is up."""
        deadline = time.monotonic() + timeout_s
        while not self.received and time.monotonic() < deadline:
            time.sleep(0.5)
        return self.received


@contextmanager
def webhook_receiver():
    receiver = WebhookReceiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        yield receiver
    finally:
        receiver.shutdown()
        receiver.server_close()
