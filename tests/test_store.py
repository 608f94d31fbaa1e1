import json

import fsspec
import pytest

from tbench.core.errors import StorageError
from tbench.core.layout import RunLayout
from tbench.stages.store import file_entries, is_local, staging_root, upload_run, write_manifest


def make_run(tmp_path):
    layout = RunLayout(tmp_path / "runs", "m-1").create()
    (layout.report_md).write_text("# report")
    (layout.plots_dir / "p.png").write_bytes(b"png")
    return layout


def test_local_root_is_the_staging_folder(tmp_path):
    assert is_local(str(tmp_path)) and is_local(f"file://{tmp_path}")
    assert staging_root(str(tmp_path)) == tmp_path
    assert not is_local("memory://bucket/runs")


def test_manifest_lists_every_file_with_its_hash(tmp_path):
    layout = make_run(tmp_path)
    write_manifest(layout.run_dir, {"run_id": "m-1", "status": "completed"})
    manifest = json.loads(layout.manifest_json.read_text())
    assert {e["path"] for e in manifest["files"]} == {"report.md", "plots/p.png"}
    assert manifest["status"] == "completed"
    assert not list(layout.run_dir.glob(".*.tmp"))


def test_upload_through_fsspec_writes_the_manifest_last(tmp_path, monkeypatch):
    from fsspec.implementations.memory import MemoryFileSystem

    layout = make_run(tmp_path)
    write_manifest(layout.run_dir, {"run_id": "m-1"})
    fs = fsspec.filesystem("memory")
    order = []
    put = MemoryFileSystem.put_file
    monkeypatch.setattr(
        MemoryFileSystem,
        "put_file",
        lambda self, lpath, rpath, **kw: (order.append(lpath), put(self, lpath, rpath, **kw))[1],
    )
    url = upload_run(layout.run_dir, "memory://bucket/runs", "m-1")
    assert url == "memory://bucket/runs/m-1"
    assert order[-1].endswith("manifest.json")
    assert fs.cat_file("/bucket/runs/m-1/report.md") == b"# report"
    assert not [p for p in fs.find("/bucket/runs/m-1") if ".tmp-" in p]
    assert len(file_entries(layout.run_dir)) == 2


def test_unreachable_storage_keeps_the_local_copy_and_says_where(tmp_path):
    layout = make_run(tmp_path)
    write_manifest(layout.run_dir, {"run_id": "m-1"})
    with pytest.raises(StorageError, match=f"kept at {layout.run_dir}"):
        upload_run(layout.run_dir, "nosuchscheme://bucket", "m-1")
    assert layout.report_md.exists()


def test_a_retried_upload_sends_only_what_is_missing_and_the_manifest_last(tmp_path, monkeypatch):
    from fsspec.implementations.memory import MemoryFileSystem

    from tbench.stages.store import retry_upload

    layout = make_run(tmp_path)
    write_manifest(layout.run_dir, {"run_id": "m-1", "artifact_url": "memory://retry/runs/m-1"})
    fs = fsspec.filesystem("memory")
    sent = []
    put = MemoryFileSystem.put_file

    def failing_put(self, lpath, rpath, **kw):
        if len(sent) == 1:  # the store goes away after the first file
            raise ConnectionError("endpoint gone")
        sent.append(lpath)
        return put(self, lpath, rpath, **kw)

    monkeypatch.setattr(MemoryFileSystem, "put_file", failing_put)
    with pytest.raises(StorageError, match="tbench upload"):
        upload_run(layout.run_dir, "memory://retry/runs", "m-1")
    assert not fs.exists("/retry/runs/m-1/manifest.json")  # an incomplete folder has no manifest
    first = list(sent)
    monkeypatch.setattr(
        MemoryFileSystem,
        "put_file",
        lambda self, lpath, rpath, **kw: (sent.append(lpath), put(self, lpath, rpath, **kw))[1],
    )
    assert retry_upload(layout.run_dir) == "memory://retry/runs/m-1"  # where the manifest says it was going
    again = sent[len(first) :]
    assert first[0] not in again and again[-1].endswith("manifest.json")  # the uploaded file was not sent twice
    assert fs.cat_file("/retry/runs/m-1/plots/p.png") == b"png" and fs.exists("/retry/runs/m-1/manifest.json")


def test_a_run_stored_in_a_remote_root_leaves_the_staging_folder_a_local_root_keeps_it(tmp_path, monkeypatch):
    from tbench.stages.store import KEEP_STAGED_ENV, discard_staged

    monkeypatch.delenv(KEEP_STAGED_ENV, raising=False)
    local = make_run(tmp_path / "local")
    assert not discard_staged(local.run_dir, str(tmp_path / "local" / "runs")) and local.report_md.exists()
    staged = make_run(tmp_path / "staged")
    assert discard_staged(staged.run_dir, "memory://bucket/runs") and not staged.run_dir.exists()
    kept = make_run(tmp_path / "kept")
    monkeypatch.setenv(KEEP_STAGED_ENV, "1")
    assert not discard_staged(kept.run_dir, "memory://bucket/runs") and kept.report_md.exists()


@pytest.fixture
def full_disk(tmp_path):
    """A real disk with no byte left: a 1 MiB tmpfs, filled."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")

    def fill():
        with open(disk / "filler", "wb", buffering=0) as filler:  # unbuffered: nothing left to flush at close
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError:
                pass

    try:
        yield disk, fill
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_run_on_a_full_disk_stores_every_file_and_its_manifest_from_memory(full_disk):
    from tbench.stages.store import manifest_text

    disk, fill = full_disk
    layout = make_run(disk)
    fill()
    with pytest.raises(OSError, match="No space left"):
        write_manifest(layout.run_dir, {"run_id": "m-1", "status": "failed", "error": "disk full"})
    text = manifest_text(layout.run_dir, {"run_id": "m-1", "status": "failed", "error": "disk full"})
    url = upload_run(layout.run_dir, "memory://fulldisk/runs", "m-1", manifest_text=text)
    fs = fsspec.filesystem("memory")
    stored = json.loads(fs.cat_file("/fulldisk/runs/m-1/manifest.json"))
    assert url == "memory://fulldisk/runs/m-1" and stored["error"] == "disk full"
    assert {e["path"] for e in stored["files"]} == {"report.md", "plots/p.png"}
    assert fs.cat_file("/fulldisk/runs/m-1/report.md") == b"# report"


def test_a_run_that_cannot_write_its_folder_fails_in_one_line_leaves_nothing_and_says_why_in_the_store(full_disk):
    from flows.lifecycle import start_run_folder
    from tbench.request.benchmark import BenchmarkRequest
    from tbench.stages.tracker import FAILED

    disk, fill = full_disk
    fill()
    req = BenchmarkRequest(model="resnet50", output="memory://nofolder/runs")
    with pytest.raises(StorageError) as err:
        start_run_folder(req, disk / "staging", "resnet50-x", {"model": "resnet50"})
    line = str(err.value)
    assert "\n" not in line and "No space left on device" in line and "TBENCH_STAGING_DIR" in line
    assert line.endswith("(recorded in memory://nofolder/runs/resnet50-x)")
    assert not (disk / "staging" / "resnet50-x").exists()  # nothing measured, nothing left behind
    assert not list((disk / "staging").rglob("*.json"))  # nor listed as running (stages.killed)
    stored = json.loads(fsspec.filesystem("memory").cat_file("/nofolder/runs/resnet50-x/manifest.json"))
    assert (
        stored["status"] == FAILED and stored["failed_stage"] == "staging" and stored["request"]["model"] == "resnet50"
    )
    assert stored["error"] in line
    local = BenchmarkRequest(model="resnet50", output=str(disk / "runs"))
    with pytest.raises(StorageError, match="No space left on device: free some space there") as err:
        start_run_folder(local, disk / "runs", "resnet50-y", {"model": "resnet50"})
    assert "recorded in" not in str(err.value)  # a local root is the disk that is full
