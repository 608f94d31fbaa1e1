"""Create the work pools (from infra/pools/<type>.json), their queues, and per-GPU global concurrency limits.

Each pool gets the base job template of its type with the pool's GPU kind in the workers' environment
(TBENCH_POOL_GPU, checked by every run) and its flow runs' heartbeats (tbench.team.zombies: a run whose worker dies
is marked Crashed by an automation installed with the pools) and, for Kubernetes, the GPU product node selector. Two
queues per pool: `default` (UI and laptop runs, priority 1) and `nightly` (scheduled sweeps, priority 2, so an
engineer's run goes first). GPU locks: a run takes the global concurrency limit named after its GPU's UUID and
creates it when missing (`tbench.device_lock`); `--gpu-uuid` creates them ahead, e.g. to see them in the UI before the
first run.

Usage: python -m tbench.team.pool_setup [--type docker|kubernetes|process] [--cpu-type process|docker|kubernetes]
[--pool a100 ...] [--gpu-uuid GPU-... ...]
(PREFECT_API_URL names the server). Re-running updates the pools' templates; nothing is deleted.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from pathlib import Path

from tbench.team.pools import POOL_GPU_ENV, POOLS
from tbench.team.zombies import HEARTBEAT_ENV, NEVER_STARTED_S, SILENCE_S, install_zombie_detection

INFRA = Path(__file__).resolve().parents[2] / "infra" / "pools"
QUEUES = {"default": 1, "nightly": 2}


def pool_template(pool: str, pool_type: str, defaults: dict | None = None) -> dict:
    """The base job template for one pool: the type's template with the pool's GPU kind (and node selector), and
    `defaults` as its variables' defaults (`env` merged), e.g. the local stack's endpoints for a docker pool."""
    spec = POOLS[pool]
    template = copy.deepcopy(json.loads((INFRA / f"{pool_type}.json").read_text()))
    props = template["variables"]["properties"]
    props["env"]["default"] = {**props["env"].get("default", {}), POOL_GPU_ENV: spec.gpu, **HEARTBEAT_ENV}
    if pool_type == "kubernetes" and spec.product_label:
        props["gpu_product"]["default"] = spec.product_label
    if spec.gpu == "cpu":
        _no_gpu_request(template)
    for name, value in (defaults or {}).items():  # env adds to the template's; the rest replace
        props[name]["default"] = {**props[name]["default"], **value} if name == "env" else value
    return template


def _no_gpu_request(template: dict) -> None:
    """The cpu pool asks for no GPU. Docker refuses any device request, even of 0 GPUs, on a daemon without the NVIDIA
    runtime ("could not select device driver"), so a docker template loses the request and its gpu_count."""
    props = template["variables"]["properties"]
    create = template["job_configuration"].get("container_create_kwargs")
    if isinstance(create, dict) and "device_requests" in create:
        del create["device_requests"]
        props.pop("gpu_count", None)
    elif "gpu_count" in props:
        props["gpu_count"]["default"] = 0


def create_pools(
    api_url: str | None = None,
    pool_type: str = "docker",
    names: list[str] | None = None,
    gpu_uuids: list[str] | None = None,
    env: dict | None = None,
    cpu_type: str = "process",
    cpu_defaults: dict | None = None,
    zombie_silence_s: float = SILENCE_S,
    never_started_s: float = NEVER_STARTED_S,
) -> list[str]:
    """Create or update the pools and queues; returns the pool names. The cpu pool is a process pool unless `cpu_type`
    says otherwise, with `cpu_defaults` as its variables' defaults (see pool_template)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.settings import PREFECT_API_URL, temporary_settings

    names = list(names or POOLS)
    url = api_url or (env or os.environ).get("PREFECT_API_URL")
    with temporary_settings({PREFECT_API_URL: url} if url else {}), get_client(sync_client=True) as client:
        for name in names:
            cpu = POOLS[name].gpu == "cpu"
            kind = cpu_type if cpu else pool_type
            template = pool_template(name, kind, cpu_defaults if cpu else None)
            description = (
                f"tbench workers with {POOLS[name].gpu} GPUs"
                if POOLS[name].gpu != "cpu"
                else "tbench workers without a GPU requirement (CPU profile, embedded Triton)"
            )
            client.create_work_pool(
                WorkPoolCreate(name=name, type=kind, base_job_template=template, description=description),
                overwrite=True,
            )
            for queue, priority in QUEUES.items():
                try:
                    client.read_work_queue_by_name(queue, work_pool_name=name)
                except ObjectNotFound:
                    client.create_work_queue(name=queue, work_pool_name=name, priority=priority)
        for uuid in gpu_uuids or []:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=f"tbench-gpu-{uuid}", limit=1))
            except ObjectAlreadyExists:
                pass
        # a run whose worker died is marked Crashed, not left Running (or Pending) for ever
        install_zombie_detection(zombie_silence_s, never_started_s)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--type", default="docker", choices=["docker", "kubernetes", "process"], help="Pool type of the GPU pools."
    )
    parser.add_argument(
        "--cpu-type",
        default="process",
        choices=["docker", "kubernetes", "process"],
        help="Pool type of the cpu pool (no GPU request).",
    )
    parser.add_argument(
        "--pool", action="append", choices=list(POOLS), help="Only these pools (repeat); all by default."
    )
    parser.add_argument("--gpu-uuid", action="append", help="Create the lock of this GPU ahead (nvidia-smi -L).")
    args = parser.parse_args()
    for name in create_pools(pool_type=args.type, names=args.pool, gpu_uuids=args.gpu_uuid, cpu_type=args.cpu_type):
        print(f"pool {name}: ready")


if __name__ == "__main__":
    main()
