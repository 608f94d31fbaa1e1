"""benchmarks/serving_matrix.py's cells: the plan's served format and backend per server kind, the one line a format
nothing serves is refused with, and an e2e run's `served_by` set against the plan."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load():
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("serving_matrix", BENCHMARKS / "serving_matrix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


matrix = _load()
KINDS = matrix.server_kinds()
CPU = matrix.NODES["cpu"]


def test_a_tensorflow_seed_is_served_as_onnx_where_no_tensorflow_is_and_by_its_backend_where_it_is():
    assert matrix.cell("widedeep", "tensorflow", KINDS["NGC 26.10"], CPU)["served"] == {"onnx": "onnxruntime"}
    assert matrix.cell("widedeep", "tensorflow", KINDS["NGC 25.02"], CPU)["served"] == {"tf-savedmodel": "tensorflow"}
    no_tf = matrix.cell("widedeep", "tensorflow", KINDS["tbench-triton-cpu image"], CPU)
    assert (
        no_tf["served"] == {"onnx": "python (onnxruntime)"} and "planned as tf-savedmodel" in no_tf["replanned"]["onnx"]
    )


def test_an_ensembles_parts_are_replanned_and_a_format_nothing_serves_is_refused_in_one_line():
    dlrm = matrix.cell("dlrm", "tensorflow", KINDS["NGC 26.10"], CPU)
    assert dlrm["parts"]["sparse"] == {"served_as": "onnx", "by": "onnxruntime"} and "sparse" in dlrm["replanned_parts"]
    refused = matrix.cell("nnunet", "pytorch", KINDS["tbench-triton-cpu image"], CPU)["refused"]
    assert "\n" not in refused and "can serve ts-script neither natively" in refused and "--formats onnx" in refused


def test_an_e2e_run_agrees_with_the_plan_only_where_it_served_what_the_plan_says():
    planned = matrix.cell("dlrm", "tensorflow", KINDS["embedded, no TensorFlow"], CPU)
    run = {"part": "seeds_without_tf_backend", "model": "dlrm", "without_tf": True, "ok": True, "run_dir": "/x"}
    served = "ensemble of dlrm_sparse (python (onnxruntime)), dlrm_dense (python (onnxruntime)); sparse: planned as"
    shown = matrix.shown_by(
        "dlrm", "tensorflow", "embedded, no TensorFlow", planned, [{**run, "served_by": {"ensemble": served}}]
    )
    assert shown["agrees"] and shown["run_dir"] == "/x"
    other = served.replace("dlrm_sparse (python (onnxruntime))", "dlrm_sparse (python (tensorflow))")
    assert not matrix.shown_by(
        "dlrm", "tensorflow", "embedded, no TensorFlow", planned, [{**run, "served_by": {"ensemble": other}}]
    )["agrees"]
    assert (
        matrix.shown_by("dlrm", "tensorflow", "embedded", planned, [{**run, "served_by": {}}]) is None
    )  # another kind


def test_a_run_on_the_cpu_image_shows_that_images_cell():
    planned = matrix.cell("widedeep", "tensorflow", KINDS[matrix.CPU_IMAGE], CPU)
    run = {"part": "cpu_image", "model": "widedeep", "ok": True, "run_dir": "/y"}
    served = {"onnx": "python (onnxruntime) on cpu; planned as tf-savedmodel, served as onnx"}
    shown = matrix.shown_by("widedeep", "tensorflow", matrix.CPU_IMAGE, planned, [{**run, "served_by": served}])
    assert shown["agrees"] and shown["run_dir"] == "/y"
    assert matrix.shown_by("widedeep", "tensorflow", "embedded", planned, [{**run, "served_by": served}]) is None
