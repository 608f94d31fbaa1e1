"""Options checked against this machine before anything starts: each problem is one ConfigError line (exit 2 from the
CLI), not a traceback from bind, mkdir or botocore halfway through a run."""

from __future__ import annotations

import os
import socket
import time

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from tbench.cli import app
from tbench.core.errors import ConfigError, validation_line
from tbench.planning.preflight import check_store, preflight
from tbench.request.benchmark import BenchmarkRequest, has_credentials


def request(tmp_path, **fields) -> BenchmarkRequest:
    return BenchmarkRequest(model="resnet50", output=str(tmp_path / "runs"), **fields)


@pytest.fixture
def listening_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_request_that_can_run_passes_and_its_output_folder_is_made_empty(tmp_path):
    preflight(request(tmp_path, http_port=None, checkpoint=str(tmp_path)))
    assert (tmp_path / "runs").is_dir() and not list((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("field", ["http_port", "grpc_port"])
def test_ports_outside_1_to_65535_are_refused_by_the_request(field):
    for port in (0, 65536, 99999):
        with pytest.raises(ValidationError) as err:
            BenchmarkRequest(**{field: port})
        assert validation_line(err.value).startswith(f"{field}: Input should be")
    # and by preflight for a request built without validation
    with pytest.raises(ConfigError, match=f"--{field.replace('_', '-')} 99999 is not a port"):
        preflight(BenchmarkRequest.model_construct(**{**BenchmarkRequest().model_dump(), field: 99999}))


def test_a_port_in_use_is_refused_where_the_server_binds_it(tmp_path, listening_port):
    for mode in ("embedded", "local", "docker"):
        with pytest.raises(ConfigError, match=f"--grpc-port {listening_port} is already in use on 127.0.0.1"):
            preflight(request(tmp_path, server=mode, grpc_port=listening_port))
    preflight(request(tmp_path, server="remote", server_url="h:1,h:2", grpc_port=listening_port))  # binds nothing here
    with pytest.raises(ConfigError, match="--http-port and --grpc-port are both 8000"):
        preflight(request(tmp_path, http_port=8000, grpc_port=8000))


def test_an_output_folder_that_cannot_be_made_or_written(tmp_path):
    with pytest.raises(
        ConfigError, match="cannot write the output folder /proc/forbidden/x: No such file or directory"
    ):
        preflight(BenchmarkRequest(output="/proc/forbidden/x"))
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match="cannot write the output folder .*a-file/runs: Not a directory"):
        preflight(BenchmarkRequest(output=str(tmp_path / "a-file" / "runs")))
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "read-only").mkdir(mode=0o555)
        with pytest.raises(ConfigError, match="Permission denied"):
            preflight(BenchmarkRequest(output=str(tmp_path / "read-only")))


@pytest.mark.parametrize(
    "field, option",
    [
        ("model_file", "--model-file"),
        ("input_data", "--input-data"),
        ("checkpoint", "--checkpoint"),
        ("dataset", "--dataset"),
        ("baseline", "--baseline"),
    ],
)
def test_files_the_request_names_must_exist(tmp_path, field, option):
    missing = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match=f"^{option} {missing} does not exist$"):
        preflight(request(tmp_path, **{field: missing}))
    preflight(request(tmp_path, baseline="s3://bucket/runs/r1"))  # a store URL is read by the stage that needs it


def test_the_local_servers_binary_and_backend_dir(tmp_path):
    with pytest.raises(ConfigError, match="tritonserver /nonexistent/tritonserver is not an executable file"):
        preflight(request(tmp_path, server="local", tritonserver="/nonexistent/tritonserver"))
    not_executable = tmp_path / "tritonserver"
    not_executable.write_text("")
    with pytest.raises(ConfigError, match="is not an executable file"):
        preflight(request(tmp_path, server="local", tritonserver=str(not_executable)))
    with pytest.raises(ConfigError, match=f"backend_dir {tmp_path}/nope is not a folder"):
        preflight(request(tmp_path, server="local", tritonserver="sh", backend_dir=str(tmp_path / "nope")))
    preflight(request(tmp_path, server="local", tritonserver="sh", backend_dir=str(tmp_path)))  # on PATH is fine


def test_credentials_in_a_url_are_refused_without_repeating_them():
    for field, url in (
        ("output", "s3://AKIAKEY:topsecret@bucket/runs"),
        ("baseline", "ftp://me:topsecret@host/r1"),
        ("server_url", "me:topsecret@host:8001,host:8000"),
    ):
        with pytest.raises(ValidationError) as err:
            BenchmarkRequest(**{field: url})
        line = validation_line(err.value)
        assert line.startswith(f"{field}: a URL with a user:password@ part") and "topsecret" not in line
    assert not has_credentials("s3://bucket/runs") and not has_credentials("h:8001,h:8000")
    assert not has_credentials("https://user@host/x")  # a user name alone is no secret


def test_the_artifact_store_is_reached_once_with_a_short_timeout(s3_to_stop):
    endpoint = s3_to_stop
    endpoint.create_bucket("here")
    check_store("s3://here/runs")  # the root need not exist yet: the first upload makes it
    check_store("s3://here")
    with pytest.raises(ConfigError, match="^the artifact store s3://nobucket/runs: s3://nobucket does not exist$"):
        check_store("s3://nobucket/runs")
    for root in ("s3://", "s3:///"):  # fsspec would take it as the store's root
        with pytest.raises(ConfigError, match="names no bucket: give s3://BUCKET or s3://BUCKET/PREFIX$"):
            check_store(root)
    endpoint.stop()
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        check_store("s3://here/runs")
    assert time.monotonic() - started < 5  # one attempt, not s3fs's 5 x botocore's retries
    assert str(err.value).startswith(
        f"cannot reach the artifact store s3://here/runs: EndpointConnectionError: "
        f'Could not connect to the endpoint URL: "{endpoint.url}/'
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["run", "resnet50", "--grpc-port", "99999"],
            "error: invalid option: grpc_port: Input should be less than or equal to 65535",
        ),
        (
            ["run", "resnet50", "--output", "/proc/forbidden/x"],
            "error: cannot write the output folder /proc/forbidden/x: No such file or directory",
        ),
        (
            ["search", "resnet50", "--output", "/proc/forbidden/x"],
            "error: cannot write the output folder /proc/forbidden/x",
        ),
        (["run", "resnet50", "--checkpoint", "/nonexistent.pt"], "error: --checkpoint /nonexistent.pt does not exist"),
        (
            ["run", "resnet50", "--output", "s3://key:secret@bucket/runs"],
            "error: invalid option: output: a URL with",
        ),
    ],
)
def test_the_cli_says_one_line_and_exits_2(args, message):
    result = CliRunner().invoke(app, args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert len(lines) == 1 and lines[0].startswith(message), result.output
    assert "Traceback" not in result.output and "secret@" not in result.output


def test_the_cli_refuses_a_port_in_use(listening_port, tmp_path):
    result = CliRunner().invoke(app, ["run", "resnet50", "--http-port", str(listening_port), "-o", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: --http-port {listening_port} is already in use on 127.0.0.1; "
        "pick another or leave it out for a free one"
    )


def test_a_full_disk_is_refused_before_the_run_makes_its_folder(tmp_path):
    import subprocess

    from tbench.planning.preflight import MIN_FREE_MIB

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        assert 16 < MIN_FREE_MIB  # the whole disk is less than a run needs
        with pytest.raises(ConfigError, match=r"only 16 MiB free on the disk of .*disk.*free some space"):
            preflight(BenchmarkRequest(model="resnet50", output=str(disk / "runs")))
        assert not (disk / "runs").exists() or not any((disk / "runs").iterdir())  # no run folder was made
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_cache_bound_that_is_not_a_size_is_refused_before_the_run(tmp_path, monkeypatch):
    from tbench.core.disk_cache import LIMIT_ENV

    monkeypatch.setenv(LIMIT_ENV, "20G")
    with pytest.raises(ConfigError, match=f"{LIMIT_ENV}='20G' is not a size in GiB"):
        preflight(request(tmp_path))
