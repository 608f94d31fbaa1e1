"""s3:// artifact roots against a real S3 endpoint (moto's server over HTTP): credentials from the environment or
from a Prefect Secret block, never in what the run writes."""

from __future__ import annotations

import json

import pytest

from tbench.core.errors import StorageError
from tbench.core.layout import RunLayout
from tbench.core.storage import url_to_fs
from tbench.results.dataset import query_results
from tbench.stages.store import upload_run, write_manifest
from tbench.team.stack import S3_CREDENTIALS, S3Endpoint


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    endpoint = S3Endpoint(tmp_path_factory.mktemp("s3") / "moto.log").start()
    endpoint.create_bucket("results")
    yield endpoint
    endpoint.stop()


def a_run(tmp_path, run_id="m-1"):
    import pandas as pd

    layout = RunLayout(tmp_path / "staging", run_id).create()
    layout.report_md.write_text("# report")
    pd.DataFrame(
        [
            {
                "model": "resnet50",
                "gpu": "CPU",
                "format": "onnx",
                "scenario": "offline",
                "batch_size": 1,
                "throughput_infer_per_s": 10.0,
                "status": "ok",
            }
        ]
    ).to_parquet(layout.results_parquet, index=False)
    write_manifest(layout.run_dir, {"run_id": run_id, "started_at": "2026-11-22T00:00:00+00:00"})
    return layout


def test_upload_with_credentials_from_the_environment(s3, tmp_path, monkeypatch):
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    layout = a_run(tmp_path)
    url = upload_run(layout.run_dir, "s3://results/runs", "m-1")
    fs, path = url_to_fs(url)
    assert json.loads(fs.cat_file(f"{path}/manifest.json"))["run_id"] == "m-1"
    assert fs.cat_file(f"{path}/report.md") == b"# report"
    # nothing the run wrote carries the credentials
    stored = b"".join(fs.cat_file(p) for p in fs.find(path))
    assert S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"].encode() not in stored


def test_credentials_from_a_prefect_secret_block(s3, tmp_path, monkeypatch, prefect_harness):
    from prefect.blocks.system import Secret

    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key, raising=False)
    Secret(
        value={
            "key": S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "secret": S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "endpoint_url": s3.url,
        }
    ).save("tbench-test-s3", overwrite=True)
    monkeypatch.setenv("TBENCH_STORAGE_BLOCK", "tbench-test-s3")
    layout = a_run(tmp_path, "m-2")
    from tbench.results.dataset import add_run_to_dataset

    upload_run(layout.run_dir, "s3://results/runs", "m-2")
    add_run_to_dataset(layout.run_dir, "s3://results/runs", "m-2")
    assert list(query_results("s3://results/runs", model="resnet50")["run_id"]) == ["m-2"]

    monkeypatch.setenv("TBENCH_STORAGE_BLOCK", "no-such-block")
    with pytest.raises(StorageError, match="cannot read the storage credentials block 'no-such-block'"):
        url_to_fs("s3://results/runs")


def test_results_with_the_s3_endpoint_down_is_one_line_and_exit_1(tmp_path, monkeypatch, s3_to_stop):
    from typer.testing import CliRunner

    from tbench.cli import app
    from tbench.results.dataset import add_run_to_dataset

    endpoint = s3_to_stop
    endpoint.create_bucket("down")
    layout = a_run(tmp_path, "m-3")
    add_run_to_dataset(layout.run_dir, "s3://down/runs", "m-3")
    runner = CliRunner()
    up = runner.invoke(app, ["results", "--root", "s3://down/runs"])
    assert up.exit_code == 0 and "m-3" in up.output, up.output
    endpoint.stop()
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # one attempt: the test need not wait through botocore's retries
    down = runner.invoke(app, ["results", "--root", "s3://down/runs"])
    lines = [line for line in down.output.splitlines() if line.strip()]
    assert down.exit_code == 1 and isinstance(down.exception, SystemExit), down.exception
    assert len(lines) == 1, down.output
    assert lines[0].startswith(
        "error: cannot read the results dataset under s3://down/runs: EndpointConnectionError: "
        f'Could not connect to the endpoint URL: "{endpoint.url}/'
    )
