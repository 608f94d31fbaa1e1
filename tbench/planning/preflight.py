"""Check a run's options against this machine before anything starts: each problem is one ConfigError line.

`request.resolve()` checks what the options mean (a known model, batch sizes under the max...); `preflight` checks
what the run will touch: the ports it binds, the output root it writes, the files it reads and the artifact store it
uploads to, so that a typo fails in a second rather than after an export, or as a traceback from bind or mkdir; and
what the node must have for the run to mean anything (planning.doctor.missing_for): the converters its formats need,
its server mode, a GPU for the gpu profile.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from tbench.core import disk_cache
from tbench.core.errors import ConfigError
from tbench.core.storage import error_cause, is_remote, store_errors, url_to_fs
from tbench.node.ports import port_in_use

BINDING_MODES = ("embedded", "local", "docker")  # the server modes that bind http_port/grpc_port on this machine
STORE_TIMEOUT_S = 5.0

# Paths a request names that must exist here, with the option a user gave them by.
INPUT_PATHS = {
    "model_file": "--model-file",
    "input_data": "--input-data",
    "checkpoint": "--checkpoint",
    "dataset": "--dataset",
    "baseline": "--baseline",
    "trace": "--trace",
}


def preflight(request) -> None:
    """Every check below, in the order a user would fix them; `request` is a BenchmarkRequest or ResolvedRequest."""
    check_ports(request)
    check_input_paths(request)
    check_local_server(request)
    check_node(request)
    check_output(request.output)
    disk_cache.max_bytes()  # TBENCH_CACHE_MAX_GIB is read after a conversion: a typo in it fails now, not then


def check_ports(request) -> None:
    ports = {name: getattr(request, name) for name in ("http_port", "grpc_port") if getattr(request, name) is not None}
    for name, port in ports.items():  # the request model bounds them too; this holds for one built without it
        if not 1 <= port <= 65535:
            raise ConfigError(f"--{name.replace('_', '-')} {port} is not a port (1..65535)")
    if len(ports) == 2 and ports["http_port"] == ports["grpc_port"]:
        raise ConfigError(f"--http-port and --grpc-port are both {ports['http_port']}; give two different ports")
    if request.server not in BINDING_MODES:
        return
    for name, port in ports.items():
        if port_in_use(port):
            raise ConfigError(
                f"--{name.replace('_', '-')} {port} is already in use on 127.0.0.1; "
                "pick another or leave it out for a free one"
            )


def check_input_paths(request) -> None:
    for field, option in INPUT_PATHS.items():
        value = getattr(request, field, None)
        if field == "trace" and value and value.startswith("ramp:"):  # a rate schedule, not a file
            continue
        if value and not is_remote(value) and not Path(value).expanduser().exists():
            raise ConfigError(f"{option} {value} does not exist")


def check_local_server(request) -> None:
    """local mode: the tritonserver binary and backend directory the request names (when it names them)."""
    if request.server != "local":
        return
    binary = getattr(request, "tritonserver", None)
    if binary and not (shutil.which(binary) or (Path(binary).is_file() and os.access(binary, os.X_OK))):
        raise ConfigError(f"tritonserver {binary} is not an executable file (local server mode)")
    backend_dir = getattr(request, "backend_dir", None)
    if backend_dir and not Path(backend_dir).is_dir():
        raise ConfigError(f"backend_dir {backend_dir} is not a folder (local server mode)")


def check_node(request) -> None:
    """What the request needs of this node (tbench/planning/doctor.py), all of it in one line."""
    from tbench.planning import doctor

    if missing := doctor.missing_for(request, doctor.report_for(request)):
        raise ConfigError("this node cannot run the request: " + " | ".join(missing))


MIN_FREE_MIB = 64  # a run's folder before its first point: the request, logs, the exported model, the repository


def check_output(root: str) -> None:
    if is_remote(root):
        check_store(root)
    else:
        check_local_output(root)
    check_free_space(root)


def check_free_space(root: str) -> None:
    """The disk the run is written to while it runs (the output, or the staging folder of a remote store) has room
    for a run's first files: a full disk otherwise fails the run before its folder can say why."""
    from tbench.stages.store import staging_root

    path = staging_root(root).expanduser()
    while not path.exists() and path != path.parent:
        path = path.parent
    free_mib = shutil.disk_usage(path).free / 2**20
    if free_mib < MIN_FREE_MIB:
        raise ConfigError(
            f"only {free_mib:.0f} MiB free on the disk of {path} (a run needs at least {MIN_FREE_MIB} MiB before its "
            "first point): free some space there, or write the run elsewhere (--output, or TBENCH_STAGING_DIR)"
        )


def check_local_output(root: str) -> None:
    """The folder can be made and written: made here (the run would make it) and a file written and removed."""
    path = Path(root.removeprefix("file://")).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".tbench-preflight-"):
            pass
    except OSError as err:
        raise ConfigError(f"cannot write the output folder {root}: {err.strerror or error_cause(err)}") from None


def quick_options(url: str) -> dict:
    """Backend options that fail fast: one attempt with short timeouts rather than botocore's retries (~10 s)."""
    if url.split("://", 1)[0] in ("s3", "s3a"):
        return {
            "config_kwargs": {
                "connect_timeout": STORE_TIMEOUT_S,
                "read_timeout": STORE_TIMEOUT_S,
                "retries": {"max_attempts": 1, "mode": "standard"},
            }
        }
    return {}


def check_store(url: str) -> None:
    """One look at the root in the artifact store: reachable, and its bucket (top folder) there. A root that does not
    exist yet is fine: the first upload makes it."""
    protocol, _, rest = url.partition("://")
    if not rest.strip("/"):  # "s3://" alone: fsspec takes it as the store's root, and nothing could be kept there
        raise ConfigError(
            f"the artifact root {url} names no bucket: give {protocol}://BUCKET or {protocol}://BUCKET/PREFIX"
        )
    fs, path = url_to_fs(url, **quick_options(url))
    if hasattr(fs, "retries"):  # s3fs repeats a failed call itself (5 times) on top of botocore's attempts
        fs.retries = 1
    top = path.strip("/").split("/", 1)[0]
    try:
        try:
            fs.info(path)
        except FileNotFoundError:
            if top == path.strip("/"):
                raise
            fs.info(top)
    except FileNotFoundError:
        raise ConfigError(f"the artifact store {url}: {url.split('://', 1)[0]}://{top} does not exist") from None
    except store_errors() as err:
        raise ConfigError(f"cannot reach the artifact store {url}: {error_cause(err)}") from None
