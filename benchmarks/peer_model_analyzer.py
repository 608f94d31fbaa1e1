"""Side by side with Model Analyzer (issue 57): the same user repository searched by Model Analyzer 1.58's own search
and by `tbench search --repository`, with the same server binary, perf_analyzer, search space and latency budget;
then both recommended configs re-measured by one referee.

1. **Model Analyzer** installs from PyPI into a scratch virtualenv (`~/.cache/tbench/model-analyzer-venv`, reused)
   and runs in local launch mode, CPU only, against the embedded server's binary behind a wrapper script named
   `tritonserver` (the backend directory, LD_LIBRARY_PATH and python stub tbench's EmbeddedServer gives it) and
   tritonclient 2.51's perf_analyzer behind another (the libraries tbench points it at).
2. **Two user-style repositories**, written here: `single` (the small ResNet-50 as ONNX inside a python-backend model
   that runs ONNX Runtime: the embedded server has only the python backend, and this is the model.py tbench's own
   runtime serves) and `ensemble` (a python preprocessing step, uint8 HWC image to normalised CHW floats, then the
   same model).
3. **The budget** binds: the user's own config is measured three times at the referee's concurrency, and the p99
   budget is `--budget-factor` times their median p99, so the heavier candidates exceed it.
4. **The referee**: every recommended config on a fresh embedded server, one perf_analyzer call each (count windows
   of one shared size, p99 as the stability percentile), in alternating rounds, at the load each tool recommended
   (tbench's search concurrency, Model Analyzer's pick's); median throughput and p99 per config and load, and its
   throughput under the budget (the best load whose median p99 holds it; where a config holds it at no load
   recommended, every config is measured at half the lightest load, down to one client, until each holds it somewhere).
   Model Analyzer's pick is measured a second
   time with the runtime threads per instance of tbench's pick (Model Analyzer cannot search them).
5. **tbench's half** (`tbench_search`) runs `tbench search --repository DIR --model NAME` in a subprocess; where the
   CLI does not take that yet, the run records the refusal and exits 1 with one line.

Model Analyzer searches as its defaults do for the model's kind. A model: its automatic brute search, instance counts
and max batch sizes (powers of two) with dynamic batching on, each config swept over concurrency 1..max (powers of
two), stopping a dimension early once throughput stops growing. An ensemble: its quick search (its only search for an
ensemble), a hill climb over each step's instances and max batch, the pipeline measured whole. Past `--ma-limit-s` it
is stopped with SIGINT, as a user would stop it (its quick search once revisited measured configs for 20 minutes
here), and its pick is its best measurement within the budget from its checkpoint. Its picks are checked against
Triton's rules before the referee measures them.

Usage: .venv/bin/python benchmarks/peer_model_analyzer.py [--size small] [--repositories single,ensemble]
       .venv/bin/python benchmarks/peer_model_analyzer.py --ma-only --repositories single --max-batch 4 --output F
Writes benchmarks/results/peer_model_analyzer.json with its provenance (--ma-only: the record at --output, or in the
work folder: a trial, not the record).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from provenance import RESULTS, recorded

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # standalone: the repository's tbench

from tbench.core.iospec import IoSpec, TensorSpec  # noqa: E402
from tbench.node import tools  # noqa: E402

MA_VERSION = "1.58.0"
MA_VENV = Path.home() / ".cache" / "tbench" / "model-analyzer-venv"
TBENCH = str(Path(sys.executable).with_name("tbench"))
MODEL = "resnet50"  # the single repository's model, and the ensemble's second step
PREPROCESS = "preprocess"
ENSEMBLE = "classifier"
REPOSITORIES = {"single": MODEL, "ensemble": ENSEMBLE}  # repository -> the model both tools search
# a window of this many seconds at the fastest reported throughput: perf_analyzer closes a count window at the first
# whole second past its request count, so short windows (Model Analyzer's 50 requests) are 1 s of noise each
REFEREE_WINDOW_S = 2.0
REFEREE_MIN_REQUESTS = 50  # perf_analyzer's own default, what Model Analyzer's calls use
BUDGET_MEASUREMENTS = 3  # calls of the user's config whose median p99 sets the budget
MA_LIMIT_S = 1800.0  # Model Analyzer's search stopped past this (its quick search once looped without end here)


# --- Model Analyzer's environment: a scratch virtualenv and the two wrapper scripts ---


def model_analyzer_venv(root: Path = MA_VENV) -> Path:
    """A virtualenv with triton-model-analyzer (reused when its `model-analyzer` is there); its bin folder. Kept
    apart from tbench's: it pins its own tritonclient, protobuf and numpy."""
    binary = root / "bin" / "model-analyzer"
    if binary.exists():
        return binary.parent
    base = Path(sys.base_prefix) / "bin" / "python3"  # the interpreter tbench's venv was made from
    subprocess.run([str(base), "-m", "venv", "--clear", str(root)], check=True)
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", f"triton-model-analyzer=={MA_VERSION}"]
    with open(root / "pip-install.log", "w") as log:  # pip's index warnings are many, and not this run's output
        subprocess.run(pip, check=True, stdout=log, stderr=subprocess.STDOUT)
    return binary.parent


def embedded_backends(dest: Path) -> Path:
    """The embedded server's backend folder with the python stub of this Python added, as EmbeddedServer prepares
    it for each start (here once: Model Analyzer starts the server itself)."""
    server_dir = tools.pytriton_server_dir()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server_dir / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise SystemExit(f"the embedded server has no python backend stub for Python {version}")
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(server_dir / "backends", dest)
    shutil.copy2(stub, dest / "python" / stub.name)
    return dest


def server_wrapper_text(binary: Path, backends: Path, cache: Path, path_head: str, library_path: str) -> str:
    """A `tritonserver` that is the embedded binary: its backends, its libraries, and PATH led by tbench's venv (the
    stub's interpreter imports numpy and onnxruntime from there). Model Analyzer adds its own options after these."""
    return (
        "#!/bin/sh\n"
        "# written by benchmarks/peer_model_analyzer.py: the embedded tritonserver as EmbeddedServer starts it\n"
        f'export PATH={shlex.quote(path_head)}:"$PATH"\n'
        f"export LD_LIBRARY_PATH={shlex.quote(library_path)}\n"
        f"exec {shlex.quote(str(binary))} --backend-directory={shlex.quote(str(backends))} "
        f'--cache-directory={shlex.quote(str(cache))} --allow-gpu-metrics=false "$@"\n'
    )


def perf_analyzer_wrapper_text(binary: Path, library_path: str) -> str:
    """perf_analyzer 2.51 with the libraries tbench links for it (tools.perf_analyzer_env)."""
    return (
        "#!/bin/sh\n"
        "# written by benchmarks/peer_model_analyzer.py: tritonclient 2.51's perf_analyzer as tbench runs it\n"
        f"export LD_LIBRARY_PATH={shlex.quote(library_path)}\n"
        f'exec {shlex.quote(str(binary))} "$@"\n'
    )


def write_executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def write_wrappers(folder: Path) -> dict[str, Path]:
    """`tritonserver` and `perf_analyzer` scripts in `folder`, for Model Analyzer's triton_server_path and
    perf_analyzer_path."""
    server_dir = tools.pytriton_server_dir()
    backends = embedded_backends(folder / "backends")
    server_libs = tools.library_path(tools.python_libdir(), tools.pytriton_libs_dir())
    venv_bin = str(Path(sys.executable).parent)
    server = server_wrapper_text(
        server_dir / "bin" / "tritonserver", backends, server_dir / "caches", venv_bin, server_libs
    )
    perf_libs = tools.perf_analyzer_env()["LD_LIBRARY_PATH"]
    return {
        "tritonserver": write_executable(folder / "bin" / "tritonserver", server),
        "perf_analyzer": write_executable(
            folder / "bin" / "perf_analyzer", perf_analyzer_wrapper_text(tools.perf_analyzer_binary(), perf_libs)
        ),
    }


# --- the user's repositories ---

PREPROCESS_MODEL_PY = '''"""A user's preprocessing step: uint8 HWC images to ImageNet-normalised float CHW."""

import numpy as np
import triton_python_backend_utils as pb_utils

MEAN = (np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255).reshape(1, 3, 1, 1)
STD = (np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255).reshape(1, 3, 1, 1)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            pixels = (image.astype(np.float32).transpose(0, 3, 1, 2) - MEAN) / STD
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PIXELS", np.ascontiguousarray(pixels))]))
        return responses
'''


@dataclass(frozen=True)
class UserRepository:
    """A repository as a user hands it over: its folder, the model to search, and what perf_analyzer sends it."""

    name: str
    path: Path
    model: str
    io: IoSpec
    composing: tuple[str, ...] = ()  # an ensemble's steps, in order


def export_resnet(work: Path, size: str) -> tuple[Path, IoSpec]:
    """The ResNet-50 adapter's module exported to ONNX, as `tbench run resnet50 --size SIZE` exports it."""
    import model_adapters
    from tbench.core.enums import Format
    from tbench.core.runtimes import source_digest
    from tbench.stages.export import export_model

    adapter = model_adapters.get("resnet50", size)
    module = adapter.build()
    artifact = export_model(adapter, module, Format.ONNX, work / "export", source_digest("pytorch", module))
    return Path(artifact.path), adapter.io_spec()


def write_model_config(model_dir: Path, config) -> None:
    from tbench.triton.config import to_pbtxt

    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(to_pbtxt(config))


def write_onnx_model(repo: Path, onnx: Path, io: IoSpec, max_batch: int) -> None:
    """The model as tbench's python-backend runtime serves an ONNX file (tbench.triton.repository.build_config):
    config.pbtxt naming the runtime, model.py and model.onnx in version 1; one instance, dynamic batching on,
    ONNX Runtime's own thread count (the user's defaults)."""
    from tbench.triton.config import DynamicBatching, InstanceGroup, ModelConfigSpec, model_config
    from tbench.triton.repository import RUNTIME_MODEL

    spec = ModelConfigSpec(
        name=MODEL,
        io=io,
        max_batch_size=max_batch,
        dynamic_batching=DynamicBatching(),
        instance_groups=[InstanceGroup(count=1)],
        parameters={"runtime": "onnxruntime", "model_file": "model.onnx", "intra_op_threads": "0"},
    )
    write_model_config(repo / MODEL, model_config(spec))
    version = repo / MODEL / "1"
    version.mkdir(parents=True, exist_ok=True)
    shutil.copy2(RUNTIME_MODEL, version / "model.py")
    shutil.copy2(onnx, version / "model.onnx")


def image_io(model_io: IoSpec) -> tuple[IoSpec, IoSpec]:
    """The preprocessing step's and the ensemble's tensors: a uint8 HWC image in, the model's outputs out."""
    channels, height, width = model_io.inputs[0].shape
    image = TensorSpec(name="IMAGE", dtype="uint8", shape=[height, width, channels])
    pixels = TensorSpec(name="PIXELS", dtype="float32", shape=[channels, height, width])
    scores = TensorSpec(name="SCORES", dtype=model_io.outputs[0].dtype, shape=model_io.outputs[0].shape)
    return IoSpec(inputs=[image], outputs=[pixels]), IoSpec(inputs=[image], outputs=[scores])


def write_single_repository(root: Path, onnx: Path, io: IoSpec, max_batch: int) -> UserRepository:
    write_onnx_model(root, onnx, io, max_batch)
    return UserRepository("single", root, MODEL, io)


def write_ensemble_repository(root: Path, onnx: Path, io: IoSpec, max_batch: int) -> UserRepository:
    """preprocess (python) -> resnet50, each with dynamic batching and one instance, under an ensemble."""
    from tbench.triton.config import (
        DynamicBatching,
        EnsembleStep,
        InstanceGroup,
        ModelConfigSpec,
        ensemble_config,
        model_config,
    )

    write_onnx_model(root, onnx, io, max_batch)
    step_io, ensemble_io = image_io(io)
    spec = ModelConfigSpec(
        name=PREPROCESS,
        io=step_io,
        max_batch_size=max_batch,
        dynamic_batching=DynamicBatching(),
        instance_groups=[InstanceGroup(count=1)],
    )
    write_model_config(root / PREPROCESS, model_config(spec))
    (root / PREPROCESS / "1").mkdir(parents=True, exist_ok=True)
    (root / PREPROCESS / "1" / "model.py").write_text(PREPROCESS_MODEL_PY)
    steps = [
        EnsembleStep(model_name=PREPROCESS, input_map={"IMAGE": "IMAGE"}, output_map={"PIXELS": "pixels"}),
        EnsembleStep(
            model_name=MODEL,
            input_map={io.inputs[0].name: "pixels"},
            output_map={io.outputs[0].name: "SCORES"},
        ),
    ]
    write_model_config(root / ENSEMBLE, ensemble_config(ENSEMBLE, max_batch, ensemble_io, steps))
    (root / ENSEMBLE / "1").mkdir(parents=True, exist_ok=True)  # Triton wants a version folder, empty for an ensemble
    return UserRepository("ensemble", root, ENSEMBLE, ensemble_io, composing=(PREPROCESS, MODEL))


# --- the search space both tools get ---


@dataclass(frozen=True)
class Space:
    """Model Analyzer's automatic brute search: instance counts min..max and max batch sizes 1..max (powers of two),
    dynamic batching on with no preferred size or delay, concurrency 1..max (powers of two)."""

    max_instances: int = 2
    max_batch: int = 8
    max_concurrency: int = 8

    @staticmethod
    def powers_of_two(top: int) -> list[int]:
        return [2**i for i in range(int(math.log2(top)) + 1)]

    def describe(self) -> dict:
        return {
            "instances": list(range(1, self.max_instances + 1)),
            "max_batch_sizes": self.powers_of_two(self.max_batch),
            "dynamic_batching": "on (no preferred sizes, no delay)",
            "concurrency": self.powers_of_two(self.max_concurrency),
        }


# --- Model Analyzer's run and its recommendation ---


def ma_config(repo: UserRepository, space: Space, budget_ms: float, wrappers: dict[str, Path], out: Path) -> dict:
    """Model Analyzer's profile config: local launch mode, CPU only, its automatic search over `space` (brute, or
    quick for an ensemble), the p99 budget as a constraint; everything it writes under `out`."""
    profiled = {"cpu_only": True, "constraints": {"perf_latency_p99": {"max": round(budget_ms, 3)}}}
    config = {
        "model_repository": str(repo.path),
        "profile_models": {repo.model: profiled},
        "triton_launch_mode": "local",
        "triton_server_path": str(wrappers["tritonserver"]),
        "perf_analyzer_path": str(wrappers["perf_analyzer"]),
        "triton_output_path": str(out / "tritonserver.log"),
        "perf_output": True,
        "perf_output_path": str(out / "perf_analyzer.log"),
        "gpus": [],  # no GPU to watch (dcgm_disable is refused outside remote mode: Model Analyzer 1.58's rule)
        # its default for the model's kind: brute for a model, quick (its ensemble search) for an ensemble
        "run_config_search_mode": "quick" if repo.composing else "brute",
        "run_config_search_min_instance_count": 1,
        "run_config_search_max_instance_count": space.max_instances,
        "run_config_search_min_model_batch_size": 1,
        "run_config_search_max_model_batch_size": space.max_batch,
        "run_config_search_min_concurrency": 1,
        "run_config_search_max_concurrency": space.max_concurrency,
        "output_model_repository_path": str(out / "output_model_repository"),
        "override_output_model_repository": True,
        "export_path": str(out / "export"),
        "checkpoint_directory": str(out / "checkpoints"),
        "skip_detailed_reports": True,  # its detailed reports need GPU metrics; the summary tables are read here
    }
    if repo.composing:  # each step CPU only as well (1.58's `ensemble_composing_models` shares its config object
        # with profile_models: given there, the steps replace the ensemble as the models profiled, each alone)
        config["cpu_only_composing_models"] = list(repo.composing)
    return config


def run_model_analyzer(venv_bin: Path, config: dict, out: Path, limit_s: float = MA_LIMIT_S) -> dict:
    """`model-analyzer profile -f CONFIG` timed by the wall clock; its log beside the config. Past `limit_s` it is
    interrupted as a user would stop it (SIGINT, up to its own limit of three: it saves its checkpoint and exits), and
    the record says so (`stopped_at_limit`): its quick search once revisited measured configs without end here."""
    import signal

    import yaml

    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [str(venv_bin / "model-analyzer"), "profile", "-f", str(config_path)]
    env = {**os.environ, "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}"}
    start, stopped = time.monotonic(), False
    with open(out / "model_analyzer.log", "w") as log:
        # SIGINT as Model Analyzer's own (a parent that ignores it, a test runner's worker say, would pass that on)
        sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out, preexec_fn=sigint)
        try:
            proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            stopped = True
            for _ in range(3):
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                    break
                except subprocess.TimeoutExpired:
                    continue
            else:
                proc.kill()
                proc.wait()
    wall = round(time.monotonic() - start, 1)
    return {
        "exit": proc.returncode,
        "wall_s": wall,
        "stopped_at_limit": stopped,
        "limit_s": limit_s,
        "argv": shlex.join(argv),
        "log": str(out / "model_analyzer.log"),
    }


# Model Analyzer's inference table (results/metrics-model-inference.csv): an ensemble's "Model Config Path",
# "Instance Group" and "Max Batch Size" cells hold commas ("classifier_config_0: preprocess_config_1,
# resnet50_config_2"); its first three and last three columns are plain, and the config names are found by their form
CONFIG_NAME = re.compile(r"[\w.-]+?_config_(?:\d+|default)")
HEAD = ("Model", "Batch", "Concurrency")
TAIL = ("Satisfies Constraints", "Throughput (infer/sec)", "p99 Latency (ms)")


@dataclass(frozen=True)
class MaRow:
    """One measurement of Model Analyzer's inference table, in its own order (its best config first, and within a
    config its passing measurements first, best first)."""

    model: str
    concurrency: int
    config: str  # the (top-level) variant, e.g. resnet50_config_3
    composing: tuple[str, ...]  # an ensemble's step variants
    passes: bool
    throughput: float
    p99_ms: float


def parse_ma_inference_table(text: str) -> list[MaRow]:
    lines = [line for line in text.splitlines() if line.strip()]
    header = lines[0].split(",")
    if tuple(header[:3]) != HEAD or tuple(header[-3:]) != TAIL:
        raise ValueError(f"not Model Analyzer's default inference table: {lines[0]!r}")
    rows = []
    for line in lines[1:]:
        head, tail = line.split(",", 3)[:3], line.rsplit(",", 3)[-3:]
        names = CONFIG_NAME.findall(line.split(",", 3)[3].rsplit(",", 3)[0])
        rows.append(
            MaRow(
                model=head[0],
                concurrency=int(head[2]),
                config=names[0],
                composing=tuple(names[1:]),
                passes=tail[0].strip() == "Yes",
                throughput=float(tail[1]),
                p99_ms=float(tail[2]),
            )
        )
    return rows


def ma_recommendation(rows: list[MaRow]) -> MaRow | None:
    """What Model Analyzer recommends: its top config's top measurement among those meeting the constraints (its
    summary's pick, `top_n_results(1)`: the table lists configs best first, a config's passing rows first); None where
    nothing met them."""
    return next((row for row in rows if row.passes), None)


def ma_counts(rows: list[MaRow]) -> dict:
    configs = {row.config for row in rows}
    return {
        "configs_measured": len(configs),
        "measurements": len(rows),
        "over_budget": sum(not row.passes for row in rows),
    }


def variant_config(output_repo: Path, variant: str, model: str) -> str:
    """A variant's config.pbtxt from Model Analyzer's output repository, named as the user's model again."""
    from tbench.triton.config import parse_pbtxt, to_pbtxt

    config = parse_pbtxt((output_repo / variant / "config.pbtxt").read_text())
    config.name = model
    return to_pbtxt(config)


def model_of_variant(variant: str) -> str:
    return variant.rsplit("_config_", 1)[0]


def checkpoint_rows(path: Path, model: str, budget_ms: float) -> list[MaRow]:
    """The measurements of `model` a stopped Model Analyzer kept in its checkpoint (it writes its table only when it
    finishes), best first as its table would list them: those within the budget, by throughput."""
    results = json.loads(path.read_text())["ResultManager.results"]["_results"].get(model, {})
    rows = []
    for variant, (_, measured) in results.items():
        for key, measurement in measured.items():
            for m in measurement["_model_config_measurements"]:
                figures = dict(m["_non_gpu_data"])
                p99 = figures["perf_latency_p99"]["_value"]
                composing = key.split()[-1].split(",") if "_config_" in key.split()[-1] else []
                rows.append(
                    MaRow(
                        model=model,
                        concurrency=int(m["_model_specific_pa_params"]["concurrency-range"]),
                        config=variant,
                        composing=tuple(c for c in composing if c != variant),
                        passes=p99 <= budget_ms,
                        throughput=figures["perf_throughput"]["_value"],
                        p99_ms=p99,
                    )
                )
    return sorted(rows, key=lambda r: (r.passes, r.throughput), reverse=True)


def ma_pick(out: Path, repo: UserRepository, budget_ms: float) -> dict:
    """Model Analyzer's recommended config with its figures as it reported them, and how much it measured; where it
    was stopped before writing its table, its best measurement within the budget from its checkpoint."""
    table = out / "export" / "results" / "metrics-model-inference.csv"
    if table.is_file():
        rows, source = parse_ma_inference_table(table.read_text()), str(table)
    else:
        checkpoint = out / "checkpoints" / "0.ckpt"
        rows, source = checkpoint_rows(checkpoint, repo.model, budget_ms), str(checkpoint)
    picked: dict = {"counts": ma_counts(rows), "table": source}
    best = ma_recommendation(rows)
    if best is None:
        return {**picked, "recommended": None}
    configs = {repo.model: variant_config(out / "output_model_repository", best.config, repo.model)}
    for variant in best.composing:
        name = model_of_variant(variant)
        configs[name] = variant_config(out / "output_model_repository", variant, name)
    reported = {"concurrency": best.concurrency, "throughput": best.throughput, "p99_ms": best.p99_ms}
    return {**picked, "recommended": {"variants": [best.config, *best.composing], "configs": configs, **reported}}


# --- the referee ---


@dataclass
class RefereeSettings:
    concurrency: int
    request_count: int  # per count window, one size for every config
    rounds: int
    percentile: int = 99
    stability_percentage: float = 10.0  # perf_analyzer's default, as Model Analyzer calls it
    max_trials: int = 10
    timeout_s: float = 300.0


def alternating_order(names: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, config) in measuring order: every config once a round, every other round reversed (A B, B A, A B, ...),
    so a drift of the machine over the rounds falls on each config alike and none is always measured first."""
    order = []
    for r in range(rounds):
        seq = names if r % 2 == 0 else list(reversed(names))
        order += [(r, name) for name in seq]
    return order


def medians(measurements: list[dict]) -> dict:
    """Median throughput and p99 of one config's rounds (those that measured), with the spread between rounds."""
    ok = [m for m in measurements if m.get("ok")]
    if not ok:
        return {"rounds_ok": 0}
    tput = [m["throughput"] for m in ok]
    p99 = [m["p99_ms"] for m in ok]
    return {
        "rounds_ok": len(ok),
        "rounds_unstable": sum(not m.get("stable", True) for m in ok),
        "throughput": statistics.median(tput),
        "p99_ms": statistics.median(p99),
        "throughput_range_pct": round(100 * (max(tput) - min(tput)) / statistics.median(tput), 1),
    }


def request_count(reported_throughputs: list[float], window_s: float = REFEREE_WINDOW_S) -> int:
    """One count-window size for every config: `window_s` at the fastest throughput either tool reported."""
    fastest = max([t for t in reported_throughputs if t and t > 0] or [0.0])
    return max(REFEREE_MIN_REQUESTS, math.ceil(window_s * fastest))


def repository_with(repo: UserRepository, configs: dict[str, str], dest: Path) -> Path:
    """A copy of the user's repository with the given models' config.pbtxt replaced (nothing else changes)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(repo.path, dest)
    for model, text in configs.items():
        (dest / model / "config.pbtxt").write_text(text)
    return dest


def referee_argv(repo: UserRepository, grpc_url: str, settings: RefereeSettings, csv_path: Path) -> list[str]:
    """tbench's perf_analyzer call (tbench.loadgen.perf_analyzer.perf_argv), random data as Model Analyzer sends,
    the stability judged on p99."""
    from tbench.core.enums import Scenario
    from tbench.loadgen.perf_analyzer import Point, perf_argv
    from tbench.request.measurement import Measurement

    point = Point(Scenario.ONLINE, batch_size=1, concurrency=settings.concurrency)
    measurement = Measurement(stability_percentage=settings.stability_percentage, max_trials=settings.max_trials)
    argv = perf_argv(
        tools.perf_analyzer_binary(),
        repo.model,
        grpc_url,
        point,
        measurement,
        settings.request_count,
        csv_path,
        repo.io,
    )
    return [*argv, "--percentile", str(settings.percentile)]


def measure_once(repo: UserRepository, configs: dict[str, str], settings: RefereeSettings, work: Path) -> dict:
    """One referee measurement: a fresh embedded server on a copy of the repository with `configs`, one
    perf_analyzer call, the server stopped."""
    from tbench.loadgen.perf_analyzer import parse_perf_csv
    from tbench.triton.process_server import EmbeddedServer

    served = repository_with(repo, configs, work / "repository")
    server = EmbeddedServer(served, work / "tritonserver.log")
    try:
        endpoints = server.start()
        csv_path = work / "perf.csv"
        argv = referee_argv(repo, endpoints.grpc_url, settings, csv_path)
        with open(work / "perf_analyzer.log", "w") as log:
            done = subprocess.run(
                argv, stdout=log, stderr=subprocess.STDOUT, env=tools.perf_analyzer_env(), timeout=settings.timeout_s
            )
    except Exception as e:  # a config that does not load or measure is a result of its own, not the end of the run
        return {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
    finally:
        server.stop()
    log_text = (work / "perf_analyzer.log").read_text()
    if done.returncode == 0 and csv_path.exists():
        values = parse_perf_csv(csv_path)
        return {"ok": True, "stable": True, "throughput": values["throughput_infer_per_s"], "p99_ms": values["p99_ms"]}
    return unstable_figures(log_text) or {
        "ok": False,
        "error": f"perf_analyzer exit {done.returncode}: {last_line(log_text)}",
    }


def last_line(text: str) -> str:
    return (text.strip().splitlines() or ["?"])[-1][:300]


def unstable_figures(log_text: str) -> dict | None:
    """A call whose windows never agreed within the stability percentage (perf_analyzer writes no CSV then): the mean
    of its last 3 windows, marked unstable, so that a round on a noisy machine still counts, and says so."""
    from tbench.loadgen.perf_analyzer import STABLE_WINDOWS, UNSTABLE_MARK, parse_windows

    windows = parse_windows(log_text)[-STABLE_WINDOWS:]
    if UNSTABLE_MARK not in log_text or len(windows) < STABLE_WINDOWS:
        return None
    return {
        "ok": True,
        "stable": False,
        "throughput": statistics.fmean(w.throughput for w in windows),
        "p99_ms": statistics.fmean(w.latency_us for w in windows) / 1000,  # --percentile 99: the windows' p99
    }


def referee(
    repo: UserRepository,
    picks: dict[str, dict[str, str]],
    settings: RefereeSettings,
    work: Path,
    loads: list[int] | None = None,
    budget_ms: float | None = None,
) -> dict:
    """Every pick (name -> its configs) measured in alternating rounds at each of `loads` (concurrencies; the
    settings' one by default); per pick and load its rounds and their medians, and per pick its throughput under the
    budget: the highest median throughput of a load whose median p99 holds `budget_ms` (each tool recommends a config
    at a load, so each is judged at the loads both recommended). Where a pick holds the budget at none of them (the
    machine's noise can put a recommended load over it), every pick is measured at half the lightest load, and so on
    down to one client, until each holds it somewhere: the throughput under the budget is then compared, not left
    undetermined."""
    loads = sorted(set(loads or [settings.concurrency]))
    refused = {name: why for name, configs in picks.items() if (why := refused_by_triton(repo, configs, work))}
    picks = {name: configs for name, configs in picks.items() if name not in refused}
    rounds: dict[tuple[str, int], list[dict]] = {}

    def measured_at(at_loads: list[int]) -> dict[str, dict]:
        for c in at_loads:
            for name in picks:
                rounds[(name, c)] = []
        for r, name in alternating_order(list(picks), settings.rounds):
            for c in at_loads if r % 2 == 0 else reversed(at_loads):
                at = replace(settings, concurrency=c)
                measured = measure_once(repo, picks[name], at, work / f"{name}-c{c}-round{r}")
                rounds[(name, c)].append({"round": r, **measured})
                print(f"referee {repo.name} {name} c{c} round {r + 1}/{settings.rounds}: {measured}", flush=True)
        result = {}
        for name in picks:
            by_load = {str(c): {**medians(rounds[(name, c)]), "rounds": rounds[(name, c)]} for c in loads}
            result[name] = {"loads": by_load, **under_budget(by_load, budget_ms)}
        return result

    result = measured_at(loads)
    while budget_ms is not None and loads[0] > 1 and any(r["concurrency"] is None for r in result.values()):
        loads.insert(0, loads[0] // 2)
        result = measured_at(loads[:1])
    for name, why in refused.items():  # a pick Triton would not load: its line, no figures
        result[name] = {"refused": why, "throughput": None}
        print(f"referee {repo.name} {name}: refused: {why}", flush=True)
    return result


def refused_by_triton(repo: UserRepository, configs: dict[str, str], work: Path) -> str | None:
    """What Triton would refuse in a pick, checked as tbench checks a user's repository before a server starts (an
    ensemble batching more than a step takes, say), in one line; None where it would load."""
    from tbench.core.errors import ConfigError
    from tbench.triton.user_repository import needed_models

    try:
        needed_models(repository_with(repo, configs, work / "checked"), repo.model)
    except ConfigError as err:
        return str(err).replace(str(work / "checked") + "/", "")
    return None


def under_budget(by_load: dict[str, dict], budget_ms: float | None) -> dict:
    """A pick's throughput under the budget (its best load whose median p99 holds it; every load without a budget),
    and that load; None where no load held it."""
    held = {c: m for c, m in by_load.items() if m.get("rounds_ok") and (budget_ms is None or m["p99_ms"] <= budget_ms)}
    if not held:
        return {"throughput": None, "p99_ms": None, "concurrency": None}
    c, best = max(held.items(), key=lambda item: item[1]["throughput"])
    return {"throughput": best["throughput"], "p99_ms": best["p99_ms"], "concurrency": int(c)}


def referee_verdict(ours: dict, theirs: dict) -> str:
    """Whether the referee's rounds separate two picks, each at the load it was judged at (under_budget's): "higher"
    or "lower" where every round of ours beat, or lost to, every round of theirs; "undetermined" where their rounds'
    ranges overlap (the ratio of medians is then within the rounds' spread); "refused" where theirs would not load;
    "none within the budget" where ours held it at no load."""
    if theirs.get("refused"):
        return "refused"
    if not ours.get("concurrency"):
        return "none within the budget"
    if not theirs.get("concurrency"):
        return "higher"

    def at_load(pick: dict) -> list[float]:
        return [r["throughput"] for r in pick["loads"][str(pick["concurrency"])]["rounds"] if r.get("ok")]

    a, b = at_load(ours), at_load(theirs)
    if min(a) > max(b):
        return "higher"
    if max(a) < min(b):
        return "lower"
    return "undetermined"


def with_threads_of(configs: dict[str, str], reference: dict[str, str]) -> dict[str, str] | None:
    """`configs` with each model's runtime threads per instance set as `reference` sets that model's (Model
    Analyzer's pick given tbench's threads: it cannot search them); None where no model's threads differ."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from tbench.search.config_edit import thread_parameter, to_text

    changed, out = False, dict(configs)
    for model, text in configs.items():
        if model not in reference:
            continue
        config = text_format.Parse(text, mc.ModelConfig())
        ref = text_format.Parse(reference[model], mc.ModelConfig())
        key = thread_parameter(config)
        if key and key in ref.parameters and config.parameters[key].string_value != ref.parameters[key].string_value:
            config.parameters[key].string_value = ref.parameters[key].string_value
            out[model], changed = to_text(config), True
    return out if changed else None


def max_batch_sizes(repo: UserRepository, picks: dict[str, dict[str, str]]) -> dict[str, dict[str, int]]:
    """Each model's max batch as the user wrote it and in each pick (a pick that leaves a model as written: the
    user's): an ensemble's own max batch is what its clients may send, and Model Analyzer's ensemble search lowers it
    to its steps' smallest."""
    from tbench.triton.config import parse_pbtxt

    users = user_configs(repo)
    return {
        model: {
            "user": parse_pbtxt(text).max_batch_size,
            **{name: parse_pbtxt(pick.get(model, text)).max_batch_size for name, pick in picks.items()},
        }
        for model, text in users.items()
    }


def user_configs(repo: UserRepository) -> dict[str, str]:
    """The repository's own configs, as the user wrote them."""
    return {name: (repo.path / name / "config.pbtxt").read_text() for name in (repo.model, *repo.composing)}


def choose_budget(repo: UserRepository, concurrency: int, factor: float, work: Path) -> dict:
    """The p99 budget from first measurements: the user's own config at the referee's concurrency, the median p99 of
    BUDGET_MEASUREMENTS calls (one call's p99 moved 4.4 to 8.4 ms between runs) times `factor` (< 1: that config at
    that load exceeds it, and so do the candidates that batch or queue more). A short call first sizes the windows of
    those that count (REFEREE_WINDOW_S at the throughput it saw)."""
    configs = user_configs(repo)
    short = RefereeSettings(concurrency=concurrency, request_count=REFEREE_MIN_REQUESTS, rounds=1)
    sizing = measure_once(repo, configs, short, work / "sizing")
    if not sizing.get("ok"):
        raise SystemExit(f"{repo.name}: the user's own config did not measure: {sizing.get('error')}")
    settings = RefereeSettings(concurrency=concurrency, request_count=request_count([sizing["throughput"]]), rounds=1)
    first = []
    for n in range(BUDGET_MEASUREMENTS):
        measured = measure_once(repo, configs, settings, work / f"measured{n}")
        if not measured.get("ok"):
            raise SystemExit(f"{repo.name}: the user's own config did not measure: {measured.get('error')}")
        first.append(measured)
    p99 = statistics.median(m["p99_ms"] for m in first)
    return {
        "budget_ms": round(factor * p99, 3),
        "factor": factor,
        "first_measurements": {"request_count": settings.request_count, "p99_ms_median": p99, "calls": first},
    }


# --- tbench's half ---


class TbenchSearchUnavailable(RuntimeError):
    """`tbench search` does not take --repository yet: the comparison cannot be made (not faked)."""


def budget_fraction(pipeline: bool) -> float:
    """smart's share of the grid measured. A model's grid (instances x max batch, 8 configs here): half of it, as
    Model Analyzer's brute search stops early once throughput stops growing (smart's default 10% is one
    measurement). A pipeline step's grid is 2 configs (its max batch held at the ensemble's by Triton's rule): both."""
    return 1.0 if pipeline else 0.5


def tbench_search(
    repo_dir: Path, model: str, budget_ms: float, space: Space, concurrency: int, out: Path, pipeline: bool = False
) -> dict:
    """**tbench's half**: `tbench search --repository DIR --model NAME` over the same space and budget, timed by the
    wall clock; its recommended config(s) and figures as it reported them (search.json's best).

    Raises TbenchSearchUnavailable where the CLI refuses the option (issue 57's part not landed yet)."""
    described = space.describe()
    argv = [
        TBENCH,
        "search",
        "--repository",
        str(repo_dir),
        "--model",
        model,
        "--instances",
        ",".join(map(str, described["instances"])),
        "--max-batch-sizes",
        ",".join(map(str, described["max_batch_sizes"])),
        "--preferred",
        "none",
        "--queue-delays-us",
        "0",
        "--budget-fraction",
        str(budget_fraction(pipeline)),
        "--p99-budget-ms",
        f"{budget_ms:g}",
        "--concurrency",
        str(concurrency),
        "--output",
        str(out),
    ]
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True)
    wall = round(time.monotonic() - start, 1)
    if done.returncode not in (0, 3):
        last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["?"])[-1]
        if "--repository" in last or "No such option" in last or "Unknown option" in last:
            raise TbenchSearchUnavailable(f"tbench search --repository: {last.strip()}")
        raise RuntimeError(f"tbench search exit {done.returncode}: {last.strip()}")
    run_dir = Path(done.stdout.strip().splitlines()[-1])
    summary = json.loads((run_dir / "search.json").read_text())
    best = summary.get("best") or {}
    return {
        "wall_s": wall,
        "argv": shlex.join(argv),
        "run_dir": str(run_dir),
        "measured": summary.get("measured"),
        "grid_size": summary.get("grid_size"),
        "recommended": recommended_configs(run_dir, model) if best else None,
        "reported": {
            "throughput": best.get("throughput"),
            "p99_ms": best.get("p99_ms"),
            "concurrency": best.get("concurrency"),  # the load its search chose (search_load)
            "candidate": best,
        },
    }


def recommended_configs(run_dir: Path, model: str) -> dict[str, str]:
    """The config.pbtxt files tbench writes out ready to copy back: every `<model>/config.pbtxt` under the run folder's
    recommended/ (the issue's "recommended config.pbtxt written out")."""
    found = {p.parent.name: p.read_text() for p in sorted((run_dir / "recommended").glob("*/config.pbtxt"))}
    if not found:  # an ensemble's are its steps' (its own config is not searched)
        raise RuntimeError(f"{run_dir}: no recommended/*/config.pbtxt to re-measure ({model})")
    return found


# --- one repository, both tools ---


@dataclass
class Plan:
    size: str
    space: Space
    concurrency: int
    rounds: int
    budget_factor: float
    budget_ms: float | None
    ma_only: bool
    work: Path
    venv_bin: Path = field(default=MA_VENV / "bin")
    wrappers: dict[str, Path] = field(default_factory=dict)
    ma_limit_s: float = MA_LIMIT_S


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


def compare_repository(repo: UserRepository, plan: Plan, result: dict) -> None:
    """Budget, Model Analyzer's search, tbench's (unless --ma-only), then the referee of their picks, into `result`
    as each part ends (a part that fails leaves the earlier ones recorded)."""
    work = plan.work / repo.name
    result.update(model=repo.model, space=plan.space.describe())
    if plan.budget_ms:
        result.update(budget_ms=plan.budget_ms, factor=None, first_measurements=None)
    else:
        result.update(choose_budget(repo, plan.concurrency, plan.budget_factor, work / "budget"))
    print(f"{repo.name}: p99 budget {result['budget_ms']} ms", flush=True)
    config = ma_config(repo, plan.space, result["budget_ms"], plan.wrappers, work / "model_analyzer")
    ran = run_model_analyzer(plan.venv_bin, config, work / "model_analyzer", plan.ma_limit_s)
    print(f"{repo.name}: Model Analyzer exit {ran['exit']} in {ran['wall_s']} s", flush=True)
    result["model_analyzer"] = ran
    if ran["exit"] != 0 and not ran["stopped_at_limit"]:
        raise SystemExit(f"{repo.name}: Model Analyzer failed (exit {ran['exit']}); its log: {ran['log']}")
    ma = result["model_analyzer"] = {**ran, **ma_pick(work / "model_analyzer", repo, result["budget_ms"])}
    result["budget_bound"] = bool(ma["counts"]["over_budget"])
    picks = {"model_analyzer": ma["recommended"]["configs"]} if ma["recommended"] else {}
    reported = [ma["recommended"]["throughput"]] if ma["recommended"] else []
    if not plan.ma_only:
        budget, pipeline = result["budget_ms"], bool(repo.composing)
        tb = result["tbench"] = tbench_search(
            repo.path, repo.model, budget, plan.space, plan.concurrency, work / "tbench", pipeline
        )
        if tb["recommended"]:
            picks["tbench"] = tb["recommended"]
            reported.append(tb["reported"]["throughput"])
    if "tbench" in picks and "model_analyzer" in picks:
        same = with_threads_of(picks["model_analyzer"], picks["tbench"])
        if same:  # the goal's third row: Model Analyzer's pick with the runtime threads tbench's pick runs
            picks["model_analyzer_same_threads"] = same
    result["max_batch_sizes"] = max_batch_sizes(repo, picks)
    settings = RefereeSettings(plan.concurrency, request_count(reported), plan.rounds)
    # the loads each tool recommended its pick at (tbench's search chooses one per candidate), and the sweep's top
    recommended = [ma["recommended"]] if ma["recommended"] else []
    recommended += [result["tbench"]["reported"]] if "tbench" in picks else []
    loads = [plan.concurrency] + [r["concurrency"] for r in recommended if r.get("concurrency")]
    measured = referee(repo, picks, settings, work / "referee", loads, result["budget_ms"])
    loads = sorted({int(c) for pick in measured.values() for c in pick.get("loads", {})} or set(loads))  # lighter too
    result["referee"] = {"settings": vars(settings), "loads": loads, "measured": measured}
    if not plan.ma_only:
        tb = measured.get("tbench", {}).get("throughput")
        result["tbench_over_ma_throughput"] = ratio(tb, measured.get("model_analyzer", {}).get("throughput"))
        result["tbench_over_ma_same_threads_throughput"] = ratio(
            tb, measured.get("model_analyzer_same_threads", {}).get("throughput")
        )
        result["tbench_over_ma_wall"] = ratio(result["tbench"]["wall_s"], ma["wall_s"])
        if "tbench" in measured:  # can the referee's rounds tell the picks apart at all
            result["referee_verdicts"] = {
                other: referee_verdict(measured["tbench"], measured[other])
                for other in ("model_analyzer", "model_analyzer_same_threads")
                if other in measured
            }


def write_repositories(work: Path, size: str, names: list[str], max_batch: int) -> list[UserRepository]:
    onnx, io_spec = export_resnet(work, size)
    writers = {"single": write_single_repository, "ensemble": write_ensemble_repository}
    return [writers[name](work / "user" / name, onnx, io_spec, max_batch) for name in names]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="small", help="The ResNet-50's size (small: what the issue measured).")
    parser.add_argument("--repositories", default="single,ensemble", help="single, ensemble or both.")
    parser.add_argument("--max-instances", type=int, default=2)
    parser.add_argument("--max-batch", type=int, default=8, help="Max batch sizes 1..this, powers of two.")
    parser.add_argument("--concurrency", type=int, default=8, help="The sweep's top and the referee's load.")
    parser.add_argument("--rounds", type=int, default=6, help="Referee rounds, alternating.")
    parser.add_argument("--budget-ms", type=float, help="A fixed p99 budget instead of one from a first measurement.")
    parser.add_argument("--budget-factor", type=float, default=0.8, help="Budget: the user config's p99 times this.")
    parser.add_argument("--ma-only", action="store_true", help="Model Analyzer's half and the referee of its pick.")
    parser.add_argument("--ma-limit-s", type=float, default=MA_LIMIT_S, help="Model Analyzer stopped past this.")
    parser.add_argument("--work", help="Work folder (a fresh temporary one by default).")
    parser.add_argument("--output", help="Where the record goes instead (a trial's); --ma-only's default: --work.")
    return parser.parse_args(argv)


def record_of(output: str | None, size: str):
    """The record: benchmarks/results/peer_model_analyzer.json, or a trial's file elsewhere (--output, --ma-only)."""
    sizes = [f"resnet50 {size}"]
    if output:
        return recorded(Path(output), model_sizes=sizes)
    return recorded(RESULTS / "peer_model_analyzer.json", model_sizes=sizes)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="tbench-peer-ma-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.repositories.split(",") if n]
    unknown = sorted(set(names) - set(REPOSITORIES))
    if unknown:
        raise SystemExit(f"--repositories: unknown {', '.join(unknown)} (single, ensemble)")
    output = args.output or (str(work / "peer_model_analyzer_ma_only.json") if args.ma_only else None)
    space = Space(args.max_instances, args.max_batch, args.concurrency)
    plan = Plan(args.size, space, args.concurrency, args.rounds, args.budget_factor, args.budget_ms, args.ma_only, work)
    plan.ma_limit_s = args.ma_limit_s
    with record_of(output, args.size) as record:
        plan.venv_bin = model_analyzer_venv()
        plan.wrappers = write_wrappers(work / "wrappers")
        record["model_analyzer_version"] = MA_VERSION
        record["ma_only"] = args.ma_only
        record["repositories"] = {}
        for repo in write_repositories(work, args.size, names, args.max_batch):
            result = record["repositories"].setdefault(repo.name, {})
            try:
                compare_repository(repo, plan, result)
            except TbenchSearchUnavailable as e:
                result["tbench_unavailable"] = str(e)
                record.save()  # the interim copy stays, marked incomplete, with what Model Analyzer measured
                raise SystemExit(f"{e}: the comparison needs it (issue 57)") from None
            record.save()
            print(json.dumps({k: v for k, v in result.items() if k != "referee"}, default=str)[:2000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
