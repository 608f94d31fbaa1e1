"""A model file handed to a pool's worker through the artifact store (tbench.core.handover), against a real S3 endpoint
(moto's server over HTTP): uploaded with its external data under its content digest, fetched and checked file by
file."""

from __future__ import annotations

import json

import onnx
import pytest
import torch

from tbench.core import handover
from tbench.core.errors import ConfigError
from tbench.core.storage import url_to_fs
from tbench.request.benchmark import BenchmarkRequest, adapter_for
from tbench.team.stack import S3Endpoint


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    endpoint = S3Endpoint(tmp_path_factory.mktemp("s3") / "moto.log").start()
    endpoint.create_bucket("team")
    yield endpoint
    endpoint.stop()


@pytest.fixture
def env(s3, tmp_path, monkeypatch):
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(handover.CACHE_ENV, str(tmp_path / "worker-cache"))


def external_data_onnx(folder):
    """An MLP whose weights are kept beside it in weights.bin, as every model over 2 GB is saved."""
    folder.mkdir(parents=True, exist_ok=True)
    inline = folder / "inline.onnx"
    torch.onnx.export(
        torch.nn.Linear(8, 3), (torch.randn(2, 8),), str(inline), dynamo=False, input_names=["x"],
        dynamic_axes={"x": {0: "b"}},
    )  # fmt: skip
    path = folder / "mlp.onnx"
    onnx.save_model(
        onnx.load(str(inline)), str(path), save_as_external_data=True, location="weights.bin", size_threshold=0
    )
    inline.unlink()
    return path


def test_a_file_travels_with_its_external_data_and_is_checked_on_arrival(env, tmp_path):
    path = external_data_onnx(tmp_path / "laptop")
    url = handover.upload(path, "s3://team/runs")
    assert url.startswith("s3://team/runs/inputs/") and url.endswith("/mlp.onnx")
    assert handover.upload(path, "s3://team/runs") == url  # the same bytes, the same place: stored once
    fs, base = url_to_fs(url.rsplit("/", 1)[0])
    assert sorted(p.rsplit("/", 1)[1] for p in fs.find(base)) == ["handover.json", "mlp.onnx", "weights.bin"]
    local = handover.fetch(url)
    assert (
        local.read_bytes() == path.read_bytes()
        and (local.parent / "weights.bin").read_bytes() == (path.parent / "weights.bin").read_bytes()
    )
    # the worker reads the fetched copy: the model's spec comes from the file and its weights
    adapter = adapter_for(BenchmarkRequest(model_file=url))
    assert adapter.io_spec().inputs[0].shape == [8] and adapter.path == str(local)


def test_bytes_changed_in_the_store_are_refused(env, tmp_path, monkeypatch):
    path = external_data_onnx(tmp_path / "laptop")
    url = handover.upload(path, "s3://team/tampered")
    fs, base = url_to_fs(url.rsplit("/", 1)[0])
    fs.pipe_file(f"{base}/weights.bin", b"not the weights")
    with pytest.raises(ConfigError, match=r"weights.bin does not have the content it was uploaded with"):
        handover.fetch(url)
    manifest = json.loads(fs.cat_file(f"{base}/handover.json"))
    manifest["files"]["weights.bin"] = "0" * 64  # a manifest rewritten to match: the URL's digest still tells
    fs.pipe_file(f"{base}/handover.json", json.dumps(manifest).encode())
    with pytest.raises(ConfigError, match="its manifest does not match the digest"):
        handover.fetch(url)
    with pytest.raises(ConfigError, match="no upload there"):
        handover.fetch(url.replace("/inputs/", "/inputs/x"))


def test_a_submitted_repository_travels_whole_and_the_worker_plans_its_fetched_copy(env, tmp_path):
    """`tbench submit --repository DIR --model NAME`: every file of the repository uploaded under its digest; the
    worker fetches it, checked, and plans the model from its copy as it would from the user's folder."""
    from test_user_repository import EMBEDDED, user_repository

    from tbench.cli.remote import hand_over
    from tbench.triton.user_repository import plan_repository

    user = user_repository(tmp_path / "user_repo")
    request = hand_over(BenchmarkRequest(repository=str(user), repository_model="pipeline"), "s3://team/repos")
    assert request.repository.startswith("s3://team/repos/inputs/") and request.repository.endswith("/user_repo")
    local = handover.fetch(request.repository)
    # every file and folder, the ensemble's empty version folder too (Triton needs it)
    assert sorted(p.relative_to(local).as_posix() for p in local.rglob("*")) == sorted(
        p.relative_to(user).as_posix() for p in user.rglob("*")
    )
    assert plan_repository(local, "pipeline", EMBEDDED).loaded == ["doubler", "plus_one", "pipeline"]
