"""pt2: torch.export + AOTInductor packages. The converter on a tiny conv net (dynamic batch, served at batch sizes the
export never saw), its package against eager, its place in the conversion cache, the one-line refusal of a model
torch.export cannot take, `--model-file x.pt2` (the io spec from the package; another package's inputs from --shape;
a package for another device or package format refused), the Triton configs, and a run on the embedded server."""

from __future__ import annotations

import json
import re
import shutil
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from model_adapters.base import Batch, ModelAdapter
from tbench.core.artifacts import ModelArtifact
from tbench.core.enums import Format, Precision
from tbench.core.errors import ConfigError, ConversionError
from tbench.core.iospec import IoSpec, TensorSpec
from tbench.core.runtimes import run_file, run_pytorch, source_digest
from tbench.stages.converters.registry import ConversionOptions
from tbench.stages.correctness import check_artifacts
from tbench.stages.export import export_model

SPEC = IoSpec(
    inputs=[TensorSpec(name="image", dtype="float32", shape=[3, 8, 8])],
    outputs=[TensorSpec(name="logits", dtype="float32", shape=[4])],
)


def _conv_net():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    ).eval()


class ConvAdapter(ModelAdapter):
    name = "tinyconv"
    framework = "pytorch"
    metric_name = None

    def build(self):
        return _conv_net()

    def io_spec(self) -> IoSpec:
        return SPEC

    def batches(self, n_samples: int, batch_size: int, seed: int = 0) -> Iterator[Batch]:
        rng = np.random.default_rng(seed)
        for start in range(0, n_samples, batch_size):
            yield Batch(inputs={"image": rng.standard_normal((min(batch_size, n_samples - start), 3, 8, 8), "float32")})

    def predict(self, outputs):
        raise NotImplementedError

    def metric(self, predictions, labels):
        raise NotImplementedError

    def defaults(self, profile: str):
        raise NotImplementedError


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    """The tiny conv net compiled once for the module (about a minute on two cores), in a cache of its own; the
    seconds the compile took."""
    root = tmp_path_factory.mktemp("pt2")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TBENCH_CACHE_DIR", str(root / "cache"))
        adapter, module = ConvAdapter(), _conv_net()
        digest = source_digest("pytorch", module)
        started = time.monotonic()
        artifact = export_model(adapter, module, Format.PT2, root / "a", digest, ConversionOptions(max_batch_size=8))
        yield adapter, module, artifact, time.monotonic() - started, root, digest


def test_the_package_runs_like_eager_at_batches_the_export_never_saw(packaged):
    adapter, module, artifact, _, _, _ = packaged
    assert Path(artifact.path).name == "model.pt2" and artifact.format is Format.PT2 and not artifact.cached
    assert artifact.precision is Precision.FP32
    for batch in (1, 5, 8):  # the export saw batch 2
        inputs = adapter.sample_batch(batch, seed=batch)
        got, want = run_file(Format.PT2, artifact.path, SPEC, inputs), run_pytorch(module, SPEC, inputs)
        assert got["logits"].shape == (batch, 4)
        np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-5, rtol=1e-4)
    (result,) = check_artifacts(adapter, module, [artifact], atol=1e-4, rtol=1e-4)
    assert result.passed and result.format is Format.PT2


def test_a_second_conversion_comes_from_the_cache_without_compiling(packaged):
    adapter, module, artifact, compile_s, root, digest = packaged
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TBENCH_CACHE_DIR", str(root / "cache"))
        started = time.monotonic()
        again = export_model(adapter, module, Format.PT2, root / "b", digest, ConversionOptions(max_batch_size=8))
        seconds = time.monotonic() - started
    assert again.cached and Path(again.path).read_bytes() == Path(artifact.path).read_bytes()
    assert seconds < min(5.0, compile_s / 4), (seconds, compile_s)
    log = (Path(artifact.path).parent / "convert.log").read_text()
    assert log.startswith("pytorch -> pt2 in ") and "torch" in log


def test_fp16_is_exported_in_half_behind_fp32_io(packaged, tmp_path):
    from tbench.core.pt2_files import package_metadata

    adapter, module, _, _, root, digest = packaged
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TBENCH_CACHE_DIR", str(root / "cache"))
        half = export_model(adapter, module, Format.PT2, tmp_path, digest, ConversionOptions(precision=Precision.FP16))
    assert half.precision is Precision.FP16 and package_metadata(Path(half.path))["tbench.precision"] == "fp16"
    (result,) = check_artifacts(adapter, module, [half], atol=1e-2, rtol=1e-2)
    assert result.passed and 0 < result.outputs[0].max_abs_err  # FP32 io, FP16 inside


def test_a_data_dependent_branch_is_refused_in_one_line_naming_it():
    import torch

    from tbench.stages.converters.aoti import export_program

    class Gated(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # a branch on a value: torch.export cannot take it
                return x * 2
            return x

    args = (torch.randn(2, 3, 8, 8),)
    with pytest.raises(ConversionError) as caught:
        export_program(Gated().eval(), args, SPEC, 8, "Gated")
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message, message
    assert message.startswith("torch.export cannot take Gated: a data-dependent expression"), message
    assert "test_pt2.py:" in message and "`if x.sum() > 0:" in message and "ts-trace or onnx" in message


def test_a_model_file_package_brings_its_own_io_spec(packaged):
    from tbench.core.model_file import detect_format, read_model_file, run_model_file, synthetic_inputs

    _, module, artifact, _, _, _ = packaged
    assert detect_format(Path(artifact.path)) is Format.PT2
    mf = read_model_file(artifact.path)
    assert mf.format is Format.PT2 and mf.batching and mf.io_spec.model_dump() == SPEC.model_dump()
    inputs = synthetic_inputs(mf, 3)
    np.testing.assert_allclose(
        run_model_file(mf, inputs)["logits"], run_pytorch(module, SPEC, inputs)["logits"], atol=1e-5, rtol=1e-4
    )


def test_a_model_that_fixes_its_batch_is_refused_naming_the_dim():
    import torch

    from tbench.stages.converters.aoti import export_program

    class Fixed(torch.nn.Module):
        def forward(self, x):
            return x.reshape(2, -1)  # the sample's batch, baked in

    with pytest.raises(ConversionError) as caught:
        export_program(Fixed().eval(), (torch.randn(2, 3, 8, 8),), SPEC, 8, "Fixed")
    message = str(caught.value)
    assert "\n" not in message and "a dynamic dim the model fixes" in message and "batch" in message, message


def _repackaged(artifact, out: Path, **metadata) -> Path:
    """The package again with its metadata changed (None drops a key): what another team's package looks like."""
    from torch._inductor.package import package_aoti

    folder = out.with_suffix("")
    with zipfile.ZipFile(artifact.path) as archive:
        archive.extractall(folder)
    (model_dir,) = folder.glob("*/data/aotinductor/model")
    for meta in model_dir.glob("*_metadata.json"):
        values = {**json.loads(meta.read_text()), **metadata}
        meta.write_text(json.dumps({k: v for k, v in values.items() if v is not None}))
    package_aoti(str(out), {"model": [str(p) for p in sorted(model_dir.iterdir()) if p.is_file()]})
    shutil.rmtree(folder)
    return out


def test_another_package_takes_its_shapes_from_the_flag_and_its_outputs_from_a_run(packaged, tmp_path):
    from tbench.core.model_file import read_model_file

    _, _, artifact, _, _, _ = packaged
    foreign = _repackaged(artifact, tmp_path / "theirs.pt2", **{"tbench.io_spec": None, "tbench.torch": None})
    with pytest.raises(ConfigError, match=r"declares no input shapes: give --shape .* for input__0"):
        read_model_file(foreign)
    mf = read_model_file(foreign, shapes={"input__0": [3, 8, 8]})
    assert mf.batching and [t.model_dump() for t in mf.io_spec.outputs] == [
        {"name": "output__0", "dtype": "float32", "shape": [4]}
    ]


def test_a_package_that_aborts_on_synthetic_inputs_is_a_one_line_error_naming_the_dtype(tmp_path, monkeypatch):
    """A user's package indexing an embedding, fed the float32 a package's undeclared input defaults to: its kernel's
    bounds check throws in an OpenMP worker thread and aborts the process it runs in (SIGABRT, past any `except`). The
    probe runs apart (tbench.core.pt2_probe), so this process lives and the error names the flag; with it, the spec."""
    import torch

    from tbench.core.model_file import read_model_file

    class Lookup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(50, 256)  # wide enough that its kernel runs on OpenMP threads

        def forward(self, ids):
            return self.table(ids).sum(1)

    batch = torch.export.Dim("batch", min=1, max=8)
    ids = torch.zeros(2, 32, dtype=torch.int64)
    program = torch.export.export(Lookup().eval(), (ids,), dynamic_shapes=({0: batch},))
    theirs = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "lookup.pt2"))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # a worker pinned to one CPU would otherwise run the kernel inline
    # the kernel aborts the process where a worker thread's bounds check throws (without its what() where both threads
    # throw at once), and raises where only the calling thread's does: either way one line, and this process goes on
    with pytest.raises(ConfigError) as refused:
        read_model_file(Path(theirs), shapes={"input__0": [32]})
    assert re.match(
        rf"AOTInductor package {re.escape(theirs)} (aborted \(SIGABRT\)|failed) on synthetic inputs "
        r"\(input__0:2,32 float32, batch axis included\): ((RuntimeError: )?index out of bounds: 0 <= tmp2 < 50L|"
        r"terminate called after throwing an instance of 'c10::Error'); a package declares no input dtypes "
        r"\(float32 unless --dtype\): give each input's, e\.g\. --dtype input__0:int64 for token ids",
        str(refused.value),
    ), refused.value
    mf = read_model_file(Path(theirs), shapes={"input__0": [32]}, dtypes={"input__0": "int64"})
    assert [t.model_dump() for t in mf.io_spec.outputs] == [{"name": "output__0", "dtype": "float32", "shape": [256]}]
    # ids past the table's rows (as the synthetic 0..15 are for a vocabulary below 16): the error gives their range
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the calling thread runs the kernel, and its bounds check raises
    with pytest.raises(ConfigError) as past:
        read_model_file(
            Path(theirs), shapes={"input__0": [32]}, dtypes={"input__0": "int64"}, value_ranges={"input__0": [0, 80]}
        )
    assert re.search(
        r"index out of bounds: 0 <= \w+ < 50L; an index must lie in 0\.\.49: give the ids' range, "
        r"e\.g\. --value-range input__0:0,49$",
        str(past.value),
    ), past.value


def test_a_probes_death_is_told_by_its_own_line_or_the_cpp_exception():
    """probe_failure on a real abort's stderr (GPT-2's embedding, tests/golden/pt2) and on the probe's own line."""
    from tbench.core.pt2_files import PROBE_ERROR_MARK, probe_failure

    golden = (Path(__file__).parent / "golden" / "pt2" / "probe_abort.stderr").read_text()
    assert probe_failure(golden) == "index out of bounds: 0 <= tmp2 < 1000L"
    said = f"some warning\n{PROBE_ERROR_MARK}RuntimeError: expected scalar type Long\nframe #0: ..."
    assert probe_failure(said) == "RuntimeError: expected scalar type Long"
    both = "terminate called after throwing an instance of 'c10::Error'\nterminate called recursively\n"
    assert probe_failure(both) == "terminate called after throwing an instance of 'c10::Error'"  # two threads threw
    assert probe_failure("") == "no output"


def test_a_package_for_another_device_or_package_format_is_refused_naming_the_fix(packaged, tmp_path):
    from tbench.core.model_file import read_model_file

    _, _, artifact, _, _, _ = packaged
    if not __import__("torch").cuda.is_available():
        cuda = _repackaged(artifact, tmp_path / "cuda.pt2", AOTI_DEVICE_KEY="cuda")
        with pytest.raises(ConfigError, match=r"compiled for cuda and this machine has no cuda device.*re-export"):
            read_model_file(cuda)
    old = tmp_path / "old.pt2"
    with zipfile.ZipFile(artifact.path) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            dst.writestr(item, b"99" if item.filename.endswith("/archive_version") else data)
    with pytest.raises(ConfigError, match=r"package format 99 \(torch .*\); torch .* reads format .*re-export") as e:
        read_model_file(old)
    assert "\n" not in str(e.value)


def test_the_configs_serve_a_package_natively_as_torch_aoti_or_through_the_aoti_runtime(tmp_path):
    from tbench.triton.repository import ServingConfig, build_config, write_repository

    package = tmp_path / "model.pt2"
    package.write_bytes(b"pt2")
    art = ModelArtifact(
        format=Format.PT2, precision=Precision.FP32, path=str(package), io_spec=SPEC, source_hash="x", seconds=0.0
    )
    cfg = ServingConfig(
        name="tinyconv_pt2", max_batch_size=8, preferred_batch_sizes=[8], max_queue_delay_us=0, instances=1
    )
    native = build_config(cfg, art, native=True)
    assert native.platform == "torch_aoti" and not native.backend
    assert (write_repository(tmp_path / "repo", cfg, art, native=True) / "1" / "model.pt2").is_file()
    python = build_config(cfg, art, native=False)
    params = {k: v.string_value for k, v in python.parameters.items()}
    assert python.backend == "python" and params["runtime"] == "aoti" and params["model_file"] == "model.pt2"


@pytest.mark.e2e
def test_a_model_file_package_is_served_and_checked_on_the_embedded_server(packaged, prefect_harness, tmp_path):
    from conftest import run_flow

    from tbench.request.benchmark import BenchmarkRequest, Measurement

    _, _, artifact, _, _, _ = packaged
    run, results, report = run_flow(
        tmp_path,
        BenchmarkRequest(
            model_file=artifact.path,
            output=str(tmp_path),
            batch_sizes=[1, 4],
            concurrency=[2],
            measurement=Measurement(window_s=0.5, stability_percentage=50),
        ),
    )
    assert set(results["format"]) == {"pt2"} and set(results["backend"]) == {"python (aoti)"}
    assert set(results["model_format"]) == {"PyTorch AOTInductor"}
    assert (results["status"] == "ok").sum() >= 2
    (accuracy,) = json.loads((run / "accuracy.json").read_text())
    assert all(o["passed"] for o in accuracy["outputs"])
    assert "Served by: python" in report
