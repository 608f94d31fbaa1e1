"""The local stack: a Prefect server (SQLite, or PostgreSQL with a database URL), an S3 endpoint (moto's server over
HTTP), the work pools with their deployments, and a worker for the `cpu` pool, on this machine: a process worker, or a
docker worker (prefect-docker) whose runs go into containers from infra/pools/docker.json (`cpu_pool_type`).

`tbench stack up` starts it and writes `<stack dir>/stack.json` (URLs, process ids, the environment a client needs);
`tbench stack env` prints that environment as shell exports; `tbench stack down` stops it. The tests start their
own stack in a temporary folder through the same `Stack` class.

The database URL's password reaches the Prefect server process through its environment and nothing else: stack.json,
the printed environment, the worker's and the flow runs' environments and the terminal show the URL with `***`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tbench.core.errors import BenchError
from tbench.node import procs
from tbench.node.ports import free_port, release
from tbench.team import prefect_db, prefect_server
from tbench.team.zombies import NEVER_STARTED_S, SILENCE_S

PROJECT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = Path(os.environ.get("TBENCH_STACK_DIR", Path.home() / ".cache" / "tbench" / "stack"))
BUCKET = "tbench"
# moto accepts any credentials: these fixed, fake ones are printed and saved on purpose (a shell needs them). A real
# store's credentials come from the environment or TBENCH_STORAGE_BLOCK (tbench.storage) and are never printed.
S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "tbench-local",
    "AWS_SECRET_ACCESS_KEY": "tbench-local-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
DATABASE_URL_ENV = (
    "TBENCH_STACK_DATABASE_URL"  # where `tbench stack up` reads the real URL (better than argv: ps sees that)
)
DATABASE_ENV = "PREFECT_API_DATABASE_CONNECTION_URL"
SECRET_ENV = (DATABASE_URL_ENV, DATABASE_ENV)  # only the Prefect server's environment may hold these


class StackError(BenchError):
    """A part of the local stack would not start."""


def masked_url(url: str | None) -> str | None:
    """A database URL with its password as ***, for files and the terminal; one that does not parse shows its scheme
    only (SQLAlchemy's parse error would echo the whole string)."""
    if not url:
        return url
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        scheme = url.split("://", 1)[0] if "://" in url else ""
        return f"{scheme}://***" if re.fullmatch(r"[\w+.-]+", scheme) else "***"


def redact(text: str, url: str | None) -> str:
    """`text` with the URL's password (and the URL itself) masked: for messages that quote a log."""
    if not url:
        return text
    text = text.replace(url, masked_url(url))
    try:
        from sqlalchemy.engine import make_url

        password = make_url(url).password
    except Exception:
        password = None
    return text.replace(password, "***") if password else text


def wait_http(
    url: str, timeout_s: float, proc: subprocess.Popen | None = None, what: str = "", log: Path | None = None
) -> float:
    """Poll a URL until it answers (any HTTP status); seconds it took. A process that exits first is an error."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise StackError(f"{what} exited with {proc.returncode}: {procs.tail(log, 5) if log else ''}".strip())
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return time.monotonic() - start
        except urllib.error.HTTPError:
            return time.monotonic() - start
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    raise StackError(f"{what or url} did not answer within {timeout_s:.0f} s" + (f" (log: {log})" if log else ""))


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


# Prefect's worker CLI passes a first SIGINT on to the worker, which keeps polling (seen: still up 15 s later), and
# turns a second into a SIGKILL: waiting long after the first only delays every stack's stop
WORKER_FIRST_WAIT_S = 1.0


def stop_process(pid: int, timeout_s: float = 15, first_wait_s: float | None = None) -> None:
    """SIGINT the process group (Prefect's worker and server shut down cleanly on it), then SIGKILL what is left.
    A Prefect worker needs two SIGINTs: its stop passes a short `first_wait_s` (the wait after the first)."""
    waits = (timeout_s / 2 if first_wait_s is None else first_wait_s, timeout_s / 2, 0)
    for sig, wait_s in zip((signal.SIGINT, signal.SIGINT, signal.SIGKILL), waits, strict=True):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
                finished = False
            except ProcessLookupError:
                finished = True
            if finished:
                return
            try:  # reap our own child so it does not linger as a zombie
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    return
            except ChildProcessError:
                pass
            time.sleep(0.2)


@dataclass
class S3Endpoint:
    """moto's S3 server: a real HTTP S3 endpoint (in memory) that s3fs, boto3 and the AWS CLI talk to."""

    log: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.url, **S3_CREDENTIALS}

    def start(self, timeout_s: float = 60) -> S3Endpoint:
        self.proc = procs.start(
            [_bin("moto_server"), "-H", "127.0.0.1", "-p", str(self.port)], self.log, outlives_caller=True
        )
        wait_http(self.url, timeout_s, self.proc, "the S3 endpoint (moto_server)", self.log)
        return self

    def create_bucket(self, name: str = BUCKET) -> None:
        import boto3

        s3 = boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )
        try:
            s3.create_bucket(Bucket=name)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc.pid)
            self.proc = None


@dataclass
class Stack:
    """The whole local stack in one folder; see the module docstring."""

    root: Path = DEFAULT_DIR
    database_url: str | None = (
        None  # PostgreSQL: postgresql+asyncpg://user:pass@host/db (the server's env only); SQLite in root by default
    )
    api_port: int = field(default_factory=free_port)
    s3: S3Endpoint | None = None
    server: subprocess.Popen | None = None
    worker: subprocess.Popen | None = None
    pools: tuple[str, ...] = ()  # all pools by default (tbench.team.pools.POOLS); only the cpu pool gets a worker
    cpu_pool_type: str = "process"  # or "docker": the cpu pool's runs go into containers (infra/pools/docker.json)
    alert_webhook: str | None = None  # where a regression is posted (tbench.history.alerts); none by default
    zombie_silence_s: float = SILENCE_S  # a run without a heartbeat this long is marked Crashed (tbench.team.zombies)
    never_started_s: float = NEVER_STARTED_S  # and one Pending this long without starting

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}/api"

    @property
    def artifact_root(self) -> str:
        return f"s3://{BUCKET}/runs"

    def prefect_env(self) -> dict[str, str]:
        return {
            "PREFECT_HOME": str(self.root / "prefect"),
            "PREFECT_API_URL": self.api_url,
            "DO_NOT_TRACK": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_CLI_PROMPT": "false",
        }

    def client_env(self) -> dict[str, str]:
        """What a client (tests, `tbench submit`, a shell) needs to use the stack."""
        return {**self.prefect_env(), **(self.s3.env() if self.s3 else {}), "TBENCH_ARTIFACT_ROOT": self.artifact_root}

    def _env(self, **extra) -> dict[str, str]:
        """A child's environment: clients (deploy, the worker, its flow runs) never inherit the database URL."""
        inherited = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
        return {**inherited, **self.client_env(), **extra}

    def server_env(self) -> dict[str, str]:
        """The Prefect server's environment: the only place the real database URL goes."""
        env = {**os.environ, **self.client_env()}
        env.pop(DATABASE_URL_ENV, None)
        if self.database_url:
            env[DATABASE_ENV] = self.database_url
        return env

    def start_server(self, timeout_s: float = 240) -> float:
        (self.root / "prefect").mkdir(parents=True, exist_ok=True)
        log = self.root / "prefect-server.log"
        env = self.server_env()
        sqlite = None if DATABASE_ENV in env else self.root / "prefect" / "prefect.db"  # Prefect's default database
        new_sqlite = sqlite is not None and not sqlite.exists() and not prefect_db.seed(sqlite)
        self.server = procs.start(
            prefect_server.argv("server", "start", "--host", "127.0.0.1", "--port", str(self.api_port)),
            log,
            env=env,
            outlives_caller=True,
        )
        try:
            waited = wait_http(f"{self.api_url}/health", timeout_s, self.server, "the Prefect server", log)
        except StackError as err:  # its message quotes the log: a driver's error could echo the URL
            raise StackError(redact(str(err), self.database_url)) from None
        if new_sqlite:  # set up by this server: the next new stack starts from a copy
            prefect_db.keep(sqlite)
        return waited

    def cpu_pool_defaults(self) -> dict | None:
        """A docker cpu pool's containers get what the process worker's runs inherit (the S3 endpoint, the artifact
        root) and the host's network, where the API and S3 listen on 127.0.0.1. The worker would pass on its
        PREFECT_HOME, a folder of this machine: a container keeps its own in /tmp."""
        if self.cpu_pool_type != "docker":
            return None
        env = {
            **(self.s3.env() if self.s3 else {}),
            "TBENCH_ARTIFACT_ROOT": self.artifact_root,
            "PREFECT_HOME": "/tmp/prefect",
        }
        return {"env": env, "network_mode": "host"}

    def deploy_args(self) -> list[str]:
        """`prefect deploy` selectors: all deployments, or only those of the stack's pools (one on a missing pool
        fails the deploy)."""
        if not self.pools:
            return ["--all"]
        import yaml

        spec = yaml.safe_load((PROJECT / "deployments" / "prefect.yaml").read_text())
        names = [d["name"] for d in spec["deployments"] if d["work_pool"]["name"] in self.pools]
        return [arg for name in names for arg in ("--name", name)]

    def setup_pools_and_deploy(self) -> None:
        from tbench.team.pool_setup import create_pools

        create_pools(
            api_url=self.api_url,
            pool_type="process",
            names=self.pools or None,
            env=self._env(),
            cpu_type=self.cpu_pool_type,
            cpu_defaults=self.cpu_pool_defaults(),
            zombie_silence_s=self.zombie_silence_s,
            never_started_s=self.never_started_s,
        )
        deployed = procs.run(
            [
                _bin("prefect"),
                "--no-prompt",
                "deploy",
                *self.deploy_args(),
                "--prefect-file",
                str(PROJECT / "deployments" / "prefect.yaml"),
            ],
            self.root / "deploy.log",
            timeout=600,
            env=self._env(TBENCH_PROJECT_DIR=str(PROJECT)),
            cwd=PROJECT,
        )
        if deployed.returncode != 0:
            raise StackError(f"prefect deploy failed (log: {deployed.log_path}): {procs.tail(deployed.log_path, 5)}")

    def install_alert(self) -> str:
        """The regression alert (tbench.history.alerts) on this stack's server: a webhook block and its automation."""
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from tbench.history.alerts import install_regression_alert

        with temporary_settings({PREFECT_API_URL: self.api_url}):
            return install_regression_alert(self.alert_webhook)

    def start_worker(self, pool: str = "cpu") -> None:
        staging = self.root / "staging"
        staging.mkdir(parents=True, exist_ok=True)
        kind = self.cpu_pool_type if pool == "cpu" else "process"
        self.worker = procs.start(
            [_bin("prefect"), "worker", "start", "--pool", pool, "--type", kind],
            self.root / f"worker-{pool}.log",
            env=self._env(PREFECT_WORKER_QUERY_SECONDS="1", TBENCH_STAGING_DIR=str(staging), PYTHONPATH=str(PROJECT)),
            outlives_caller=True,
        )

    def up(self) -> Stack:
        self.root.mkdir(parents=True, exist_ok=True)
        self.s3 = S3Endpoint(self.root / "s3.log").start()
        self.s3.create_bucket()
        self.start_server()
        self.setup_pools_and_deploy()
        if self.alert_webhook:
            self.install_alert()
        self.start_worker()
        self.save()
        return self

    def save(self) -> None:
        state = {
            "api_url": self.api_url,
            "s3_url": self.s3.url if self.s3 else None,
            "artifact_root": self.artifact_root,
            "database": masked_url(self.database_url) or "sqlite (in prefect/)",
            "pids": {
                name: p.pid
                for name, p in (
                    ("s3", self.s3.proc if self.s3 else None),
                    ("server", self.server),
                    ("worker", self.worker),
                )
                if p is not None
            },
            "env": self.client_env(),
            "logs": str(self.root),
        }
        (self.root / "stack.json").write_text(json.dumps(state, indent=2))

    def stop_worker(self) -> None:
        if self.worker is not None:
            stop_process(self.worker.pid, first_wait_s=WORKER_FIRST_WAIT_S)
            self.worker = None

    def down(self) -> None:
        self.stop_worker()
        if self.server is not None:
            stop_process(self.server.pid)
        if self.s3 is not None:
            self.s3.stop()
            release(self.s3.port)
        release(self.api_port)  # the ports' reservations go with the stack (its S3 and API may restart before)
        self.worker = self.server = None


def load_state(root: Path = DEFAULT_DIR) -> dict:
    path = Path(root) / "stack.json"
    if not path.is_file():
        raise StackError(f"no local stack in {root} (start one with: tbench stack up)")
    return json.loads(path.read_text())


def down_from_state(root: Path = DEFAULT_DIR) -> list[str]:
    state = load_state(root)
    stopped = []
    for name in ("worker", "server", "s3"):
        pid = state["pids"].get(name)
        if pid:
            stop_process(pid, first_wait_s=WORKER_FIRST_WAIT_S if name == "worker" else None)
            stopped.append(name)
    (Path(root) / "stack.json").unlink(missing_ok=True)
    return stopped
