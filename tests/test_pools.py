"""GPU pools: the hardware check, nvidia-smi parsing, the pools' job templates and the deployments file."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from conftest import GOLDEN

from tbench.core.errors import ConfigError
from tbench.node.device_lock import lock_name
from tbench.node.hardware import Hardware, parse_cuda_version, parse_gpu_query
from tbench.team.pool_setup import INFRA, pool_template
from tbench.team.pools import POOLS, check_worker_hardware, gpu_matches
from tbench.team.stack import PROJECT
from tbench.team.zombies import HEARTBEAT_ENV


def machine(*gpus: str, uuids: list[str] | None = None) -> Hardware:
    return Hardware(
        cpu_model="x",
        cpu_cores=2,
        memory_gib=8,
        gpus=list(gpus),
        os="Linux",
        hostname="node-1",
        gpu_uuids=uuids or [f"GPU-{i}" for i in range(len(gpus))],
    )


def test_nvidia_smi_query_and_header_are_parsed():
    fields = parse_gpu_query((GOLDEN / "nvidia_smi" / "query_a100x2.csv").read_text())
    assert fields["gpus"] == ["NVIDIA A100-SXM4-80GB"] * 2 and fields["driver"] == "535.104.05"
    assert fields["gpu_uuids"][1] == "GPU-9e8d7c6b-5a4f-3e2d-1c0b-a9f8e7d6c5b4"
    assert fields["gpu_memory_mib"] == [81920, 81920] and fields["gpu_max_sm_clock_mhz"] == [1410, 1410]
    assert fields["gpu_max_mem_clock_mhz"] == [1593, 1593]
    assert parse_cuda_version((GOLDEN / "nvidia_smi" / "header_a100.txt").read_text()) == "12.2"
    assert parse_gpu_query("") == {
        "gpus": [],
        "driver": None,
        "gpu_uuids": [],
        "gpu_memory_mib": [],
        "gpu_max_sm_clock_mhz": [],
        "gpu_max_mem_clock_mhz": [],
    }


@pytest.mark.parametrize(
    "expected, name, ok",
    [
        ("A100", "NVIDIA A100-SXM4-80GB", True),
        ("A10", "NVIDIA A100-SXM4-80GB", False),
        ("T4", "Tesla T4", True),
        ("V100", "Tesla V100-SXM2-32GB", True),
        ("H100", "NVIDIA H100 80GB HBM3", True),
        ("A30", "NVIDIA A40", False),
    ],
)
def test_gpu_kind_matches_whole_names(expected, name, ok):
    assert gpu_matches(expected, name) is ok


def test_a_worker_with_the_wrong_gpu_is_refused(monkeypatch):
    check_worker_hardware(machine("NVIDIA A100-SXM4-80GB"), "A100")
    check_worker_hardware(machine(), "cpu")  # the cpu pool runs anywhere
    check_worker_hardware(machine())  # no pool named: a laptop run
    with pytest.raises(ConfigError, match="promises A100 GPUs but the machine has Tesla T4"):
        check_worker_hardware(machine("Tesla T4"), "A100")
    monkeypatch.setenv("TBENCH_POOL_GPU", "H100")
    with pytest.raises(ConfigError, match="promises H100 GPUs but the machine has none"):
        check_worker_hardware(machine())


def test_one_lock_per_gpu_or_cpu_machine():
    assert lock_name(machine("NVIDIA A100", uuids=["GPU-abc"])) == "tbench-gpu-GPU-abc"
    assert lock_name(machine()).startswith("tbench-cpu-")


@pytest.mark.parametrize("kind", ["process", "docker", "kubernetes"])
def test_pool_templates_carry_the_pools_gpu(kind):
    template = pool_template("a100", kind)
    props = template["variables"]["properties"]
    assert props["env"]["default"]["TBENCH_POOL_GPU"] == "A100"
    if kind == "docker":
        create = template["job_configuration"]["container_create_kwargs"]
        assert create["shm_size"] == "{{ shm_size }}" and create["device_requests"][0]["capabilities"] == [["gpu"]]
        assert props["image"]["default"].startswith("tbench-worker")
    if kind == "kubernetes":
        spec = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
        assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "{{ gpu_count }}"
        assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "{{ gpu_product }}"}
        assert props["gpu_product"]["default"] == "NVIDIA-A100-SXM4-80GB"
    # every template placeholder has a variable behind it
    placeholders = set(__import__("re").findall(r"\{\{ *([a-z_]+) *\}\}", json.dumps(template["job_configuration"])))
    assert placeholders <= set(props)
    assert json.loads((INFRA / f"{kind}.json").read_text())  # the files themselves are valid JSON


def test_deployments_file_has_every_flow_on_every_pool():
    spec = yaml.safe_load((PROJECT / "deployments" / "prefect.yaml").read_text())
    deployments = {d["name"]: d for d in spec["deployments"]}
    flows = ("benchmark", "search", "capacity", "fleet", "colocated")
    assert set(deployments) == {f"{flow}-{pool}" for flow in flows for pool in POOLS} | {"matrix-cpu"}
    assert deployments.pop("matrix-cpu")["entrypoint"] == "flows/matrix.py:matrix_flow"
    for name, d in deployments.items():
        flow, pool = name.split("-")
        assert d["work_pool"]["name"] == pool
        assert (
            d["entrypoint"]
            == {
                "benchmark": "flows/benchmark.py:benchmark_flow",
                "search": "flows/search.py:search_flow",
                "capacity": "flows/capacity.py:capacity_flow",
                "fleet": "flows/fleet.py:fleet_flow",
                "colocated": "flows/colocated.py:colocated_flow",
            }[flow]
        )
        assert all(s["active"] is False for s in d["schedules"])  # nightly sweeps start switched off
        directory = d["pull"][0]["prefect.deployments.steps.set_working_directory"]["directory"]
        assert directory == ("{{ $TBENCH_PROJECT_DIR }}" if pool == "cpu" else "/opt/tbench")
        assert pool in d["tags"] and d["description"]


def rendered(template: dict, job_variables: dict):
    """The job configuration prefect-docker's worker builds from a pool's template and a run's job variables."""
    import asyncio

    from prefect.client.orchestration import PrefectClient
    from prefect_docker.worker import DockerWorkerJobConfiguration

    async def render():
        async with PrefectClient("http://127.0.0.1:9/api") as client:  # unused: the templates hold no block references
            return await DockerWorkerJobConfiguration.from_template_and_values(template, job_variables, client=client)

    return asyncio.run(render())


def test_docker_gpu_pools_request_gpus_and_the_cpu_pool_none():
    a100 = rendered(pool_template("a100", "docker"), {"gpu_count": -1})
    assert a100.container_create_kwargs["device_requests"] == [
        {"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}
    ]
    assert rendered(pool_template("a100", "docker"), {}).container_create_kwargs["device_requests"][0]["count"] == 1
    # any device request, even of 0 GPUs, fails on a daemon without the NVIDIA runtime: the cpu pool makes none
    cpu = pool_template("cpu", "docker")
    assert "gpu_count" not in cpu["variables"]["properties"]
    assert set(rendered(cpu, {}).container_create_kwargs) == {"shm_size", "ulimits"}
    assert pool_template("cpu", "kubernetes")["variables"]["properties"]["gpu_count"]["default"] == 0


def test_docker_pools_ulimits_auto_remove_and_image_defaults_and_overrides():
    config = rendered(pool_template("t4", "docker"), {})
    assert config.container_create_kwargs["ulimits"] == [
        {"name": "memlock", "soft": -1, "hard": -1},
        {"name": "stack", "soft": 64 << 20, "hard": 64 << 20},
    ]
    assert config.container_create_kwargs["shm_size"] == "8g" and config.auto_remove is True
    # a daemon that may not raise memlock gets a run with other ulimits
    stack_only = [{"name": "stack", "soft": 64 << 20, "hard": 64 << 20}]
    config = rendered(pool_template("t4", "docker"), {"ulimits": stack_only})
    assert config.container_create_kwargs["ulimits"] == stack_only
    # the templates default to the tag infra/worker.Dockerfile says to build
    tag = re.search(r"-t (tbench-worker:\S+)", (PROJECT / "infra" / "worker.Dockerfile").read_text())[1]
    for kind in ("docker", "kubernetes"):
        assert pool_template("a100", kind)["variables"]["properties"]["image"]["default"] == tag


def test_pool_defaults_add_to_env_and_replace_the_rest():
    template = pool_template(
        "cpu", "docker", {"env": {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}, "network_mode": "host"}
    )
    config = rendered(template, {"env": {"HOME": "/tmp"}})
    assert config.env == {
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "TBENCH_POOL_GPU": "cpu",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "HOME": "/tmp",
        **HEARTBEAT_ENV,  # every flow run a pool starts sends heartbeats (tbench.team.zombies)
    }
    assert config.network_mode == "host"


def test_a_stack_with_a_docker_cpu_pool_deploys_only_its_pools_and_passes_its_endpoints(tmp_path):
    from tbench.team.stack import S3Endpoint, Stack

    stack = Stack(root=tmp_path, pools=("cpu",), cpu_pool_type="docker", s3=S3Endpoint(tmp_path / "s3.log", port=9000))
    args = stack.deploy_args()
    assert args[::2] == ["--name"] * 6
    flows = ("benchmark", "search", "capacity", "fleet", "colocated", "matrix")
    assert set(args[1::2]) == {f"{flow}-cpu" for flow in flows}
    defaults = stack.cpu_pool_defaults()
    assert defaults["network_mode"] == "host" and defaults["env"]["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert defaults["env"]["TBENCH_ARTIFACT_ROOT"] == "s3://tbench/runs"
    assert Stack(root=tmp_path).deploy_args() == ["--all"] and Stack(root=tmp_path).cpu_pool_defaults() is None


@pytest.mark.parametrize("text, error", [("{", "cannot read the job variables"), ("[1]", "must be a JSON object")])
def test_submit_job_variables_must_be_a_json_object(text, error):
    from tbench.cli import parse_job_variables

    assert parse_job_variables('{"image": "x:1", "volumes": ["/a:/a:ro"]}') == {"image": "x:1", "volumes": ["/a:/a:ro"]}
    with pytest.raises(ConfigError, match=error):
        parse_job_variables(text)
