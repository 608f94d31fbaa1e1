"""GPU pools: the hardware check, nvidia-smi parsing, the pools' job templates and the deployments file."""

from __future__ import annotations

import json

import pytest
import yaml

from tbench.errors import ConfigError
from tbench.hardware import Hardware, parse_cuda_version, parse_gpu_query
from tbench.pool_setup import INFRA, pool_template
from tbench.device_lock import lock_name
from tbench.pools import POOLS, check_worker_hardware, gpu_matches
from tbench.stack import PROJECT

from conftest import GOLDEN


def machine(*gpus: str, uuids: list[str] | None = None) -> Hardware:
    return Hardware(cpu_model="x", cpu_cores=2, memory_gib=8, gpus=list(gpus), os="Linux", hostname="node-1",
                    gpu_uuids=uuids or [f"GPU-{i}" for i in range(len(gpus))])


def test_nvidia_smi_query_and_header_are_parsed():
    fields = parse_gpu_query((GOLDEN / "nvidia_smi" / "query_a100x2.csv").read_text())
    assert fields["gpus"] == ["NVIDIA A100-SXM4-80GB"] * 2 and fields["driver"] == "535.104.05"
    assert fields["gpu_uuids"][1] == "GPU-9e8d7c6b-5a4f-3e2d-1c0b-a9f8e7d6c5b4"
    assert fields["gpu_memory_mib"] == [81920, 81920] and fields["gpu_max_sm_clock_mhz"] == [1410, 1410]
    assert fields["gpu_max_mem_clock_mhz"] == [1593, 1593]
    assert parse_cuda_version((GOLDEN / "nvidia_smi" / "header_a100.txt").read_text()) == "12.2"
    assert parse_gpu_query("") == {"gpus": [], "driver": None, "gpu_uuids": [], "gpu_memory_mib": [],
                                   "gpu_max_sm_clock_mhz": [], "gpu_max_mem_clock_mhz": []}


@pytest.mark.parametrize("expected, name, ok", [
    ("A100", "NVIDIA A100-SXM4-80GB", True), ("A10", "NVIDIA A100-SXM4-80GB", False), ("T4", "Tesla T4", True),
    ("V100", "Tesla V100-SXM2-32GB", True), ("H100", "NVIDIA H100 80GB HBM3", True), ("A30", "NVIDIA A40", False),
])
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
    assert set(deployments) == {f"{flow}-{pool}" for flow in ("benchmark", "search") for pool in POOLS} | {"matrix-cpu"}
    assert deployments.pop("matrix-cpu")["entrypoint"] == "flows/matrix.py:matrix_flow"
    for name, d in deployments.items():
        flow, pool = name.split("-")
        assert d["work_pool"]["name"] == pool
        assert d["entrypoint"] == {"benchmark": "flows/benchmark.py:benchmark_flow", "search": "flows/search.py:search_flow"}[flow]
        assert all(s["active"] is False for s in d["schedules"])  # nightly sweeps start switched off
        directory = d["pull"][0]["prefect.deployments.steps.set_working_directory"]["directory"]
        assert directory == ("{{ $TBENCH_PROJECT_DIR }}" if pool == "cpu" else "/opt/tbench")
        assert pool in d["tags"] and d["description"]
