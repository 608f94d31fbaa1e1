"""The docker pool for real: the local stack with its cpu pool as a docker pool (infra/pools/docker.json, no GPU
request), a Prefect docker worker (prefect-docker) that picks up a `tbench submit` run and runs it in a container from
the pool's job template, the embedded tritonserver measuring inside it, and the artifacts read back from S3.

No registry is reachable here, so the image is a few symlinks and /etc/passwd (`docker import`); the run's job
variables mount, read-only, this machine's /usr, Python, virtualenv and checkout at their own paths."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import time

import pytest
from test_stack_e2e import TBENCH, in_stack, read_back

from tbench.team.stack import PROJECT, Stack

pytestmark = pytest.mark.e2e

IMAGE = "tbench-host-base:1"
SMALL_RUN = [
    "resnet50",
    "--size",
    "small",
    "--formats",
    "onnx",
    "--batch-sizes",
    "1",
    "--concurrency",
    "1",
    "--scenarios",
    "offline",
    "--window-s",
    "0.5",
    "--stability",
    "50",
]


def base_rootfs() -> bytes:
    """A tar of a root filesystem whose programs all come from bind mounts: Debian's merged-/usr links, a writable
    /tmp, and root in /etc/passwd (Python's getpass and Path.home() look the user up)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for top in ("bin", "lib", "lib64", "sbin"):
            link = tarfile.TarInfo(top)
            link.type, link.linkname = tarfile.SYMTYPE, f"usr/{top}"
            tar.addfile(link)
        for folder, mode in (("usr", 0o755), ("etc", 0o755), ("root", 0o700), ("tmp", 0o1777)):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        for name, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", "root:x:0:\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def image(docker_env):
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        done = subprocess.run(["docker", "import", "-", IMAGE], input=base_rootfs(), capture_output=True)
        assert done.returncode == 0, done.stderr.decode()
    yield IMAGE
    # a container a failed run left behind (auto_remove takes the others)
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"ancestor={IMAGE}"], capture_output=True, text=True)
    for container in left.stdout.split():
        subprocess.run(["docker", "rm", "-f", container], capture_output=True)


@pytest.fixture(scope="module")
def docker_stack(image, tmp_path_factory):
    s = Stack(root=tmp_path_factory.mktemp("docker-stack"), pools=("cpu",), cpu_pool_type="docker")
    try:
        s.up()
        yield s
    finally:
        s.down()


def job_variables(image: str) -> dict:
    """What the run's container needs from this machine: its system, Python, virtualenv and checkout, read-only at
    their own paths (the deployment's pull step changes into the checkout); a stack ulimit this daemon can set (it may
    not raise memlock)."""
    mounts = dict.fromkeys(["/usr", sys.base_prefix, sys.prefix, str(PROJECT)])
    return {
        "image": image,
        "image_pull_policy": "Never",
        "volumes": [f"{m}:{m}:ro" for m in mounts],
        "ulimits": [{"name": "stack", "soft": 64 << 20, "hard": 64 << 20}],
        "env": {"HOME": "/tmp", "PATH": f"{sys.prefix}/bin:/usr/bin:/bin", "PYTHONPATH": str(PROJECT)},
    }


def docker_lines(*argv: str) -> list[str]:
    done = subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]


def container_events(flow_run_id: str, since: float) -> list[dict]:
    """The Docker daemon's events for the run's containers (the worker labels them with the flow run's id)."""
    window = ["--since", f"{since:.0f}", "--until", f"{time.time() + 1:.0f}"]
    lines = docker_lines(
        "events",
        *window,
        "--format",
        "{{json .}}",
        "--filter",
        "type=container",
        "--filter",
        f"label=io.prefect.flow-run-id={flow_run_id}",
    )
    return [json.loads(line) for line in lines]


def test_a_docker_worker_runs_a_submitted_run_in_a_container_from_the_pools_template(docker_stack, image):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    started = time.time()
    done = in_stack(
        docker_stack,
        [TBENCH, "submit", *SMALL_RUN, "--pool", "cpu", "--job-variables", json.dumps(job_variables(image))],
    )
    worker_log = (docker_stack.root / "worker-cpu.log").read_text(errors="replace")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:] + "\nworker:\n" + worker_log[-3000:]
    output = done.stdout + done.stderr
    assert "state: Completed" in output, output[-3000:]
    run_id = done.stdout.strip().splitlines()[-1]
    report = next(line.split("report:", 1)[1].strip() for line in output.splitlines() if "report:" in line)
    stored = read_back(docker_stack, report.rsplit("/", 1)[0])
    assert stored["manifest"]["status"] == "completed" and stored["points"] == stored["ok"] == 1
    with temporary_settings({PREFECT_API_URL: docker_stack.api_url}), get_client(sync_client=True) as client:
        pool = client.read_work_pool("cpu")
        container_id = client.read_flow_run(run_id).infrastructure_pid.rsplit(":", 1)[1]
    # a docker pool without a GPU request; the run went into a container of our image that exited 0 and was removed
    create = pool.base_job_template["job_configuration"]["container_create_kwargs"]
    assert pool.type == "docker" and "device_requests" not in create
    # the run is Completed once the flow inside reports it; the container exits and is removed (auto_remove) after
    deadline = time.monotonic() + 60
    while (
        docker_lines("ps", "-aq", "--filter", f"label=io.prefect.flow-run-id={run_id}") and time.monotonic() < deadline
    ):
        time.sleep(0.5)
    assert docker_lines("ps", "-aq", "--filter", f"label=io.prefect.flow-run-id={run_id}") == []
    events = container_events(run_id, started)
    lifecycle = [e["Action"] for e in events if e["Action"] in ("create", "start", "die", "destroy")]
    assert lifecycle == ["create", "start", "die", "destroy"], events
    assert {e["id"] for e in events} == {container_id} and events[0]["Actor"]["Attributes"]["image"] == image
    assert next(e for e in events if e["Action"] == "die")["Actor"]["Attributes"]["exitCode"] == "0"
