"""Stage 8: everything under `<artifact root>/<run id>/` through fsspec; the manifest is written last.

A local root is the staging folder itself (nothing to copy); any other fsspec URL gets a file-by-file upload,
each file written under a temporary name and moved into place, so a reader never sees half a file, and the manifest
last, so a run folder with a manifest is complete. An upload that fails keeps the local copy and says where; a retry
(`tbench upload RUN_FOLDER`) skips the files already there and finishes. The run's results also go to the root's
partitioned results dataset (`tasks.results_dataset`).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from fsspec.implementations.local import LocalFileSystem

from tbench.core.errors import StorageError
from tbench.core.storage import file_sha256, url_to_fs
from tbench.results.dataset import add_run_to_dataset

MANIFEST = "manifest.json"
STAGING_ENV = "TBENCH_STAGING_DIR"
KEEP_STAGED_ENV = "TBENCH_KEEP_STAGED"  # "1": a stored run's local copy stays in the staging folder


def is_local(root_url: str) -> bool:
    return isinstance(url_to_fs(root_url)[0], LocalFileSystem)


def staging_root(root_url: str) -> Path:
    """Where a run is written while it runs: the root itself when local, else a local cache folder."""
    if is_local(root_url):
        return Path(url_to_fs(root_url)[1])
    return Path(os.environ.get(STAGING_ENV, Path.home() / ".cache" / "tbench" / "staging"))


def run_url(root_url: str, run_id: str) -> str:
    return root_url.rstrip("/") + "/" + run_id


def file_entries(run_dir: Path) -> list[dict]:
    entries = []
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file() and p.name != MANIFEST):
        entries.append(
            {"path": path.relative_to(run_dir).as_posix(), "bytes": path.stat().st_size, "sha256": file_sha256(path)}
        )
    return entries


def write_local_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except BaseException:  # a full disk fails the write: no half-written file is left behind
        tmp.unlink(missing_ok=True)
        raise


def _put_atomic(fs, local: Path, remote: str) -> None:
    tmp = f"{remote}.tmp-{uuid.uuid4().hex[:8]}"
    fs.put_file(str(local), tmp)
    fs.mv(tmp, remote)


def _pipe_atomic(fs, text: str, remote: str) -> None:
    tmp = f"{remote}.tmp-{uuid.uuid4().hex[:8]}"
    fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(tmp, text.encode())
    fs.mv(tmp, remote)


def store_manifest_only(root_url: str, run_id: str, manifest: dict) -> str | None:
    """A run that could not even make its folder here (a full disk) still says why in the store: its manifest alone.
    Returns its URL; None for a local root (the disk that is full) or a store that cannot take it either."""
    if is_local(root_url):
        return None
    url = run_url(root_url, run_id)
    try:
        fs, path = url_to_fs(url)
        _pipe_atomic(fs, json.dumps(manifest, indent=2, default=str), path.rstrip("/") + "/" + MANIFEST)
    except Exception:  # any backend error: the run's one line says what happened all the same
        return None
    return url


def _already_there(fs, remote: str, local: Path) -> bool:
    """A file an earlier attempt uploaded: present with the same size (run folders do not change once written)."""
    try:
        return fs.size(remote) == local.stat().st_size
    except (FileNotFoundError, OSError):
        return False


def upload_run(run_dir: Path, root_url: str, run_id: str, manifest_text: str | None = None) -> str:
    """Copy a finished (or failed) run folder to the artifact root, manifest last; returns the run's URL. Files an
    earlier, interrupted upload completed are not sent again; the manifest always is (it says the folder is whole).
    `manifest_text`: the manifest to store, where it could not be written in the folder (a full disk)."""
    url = run_url(root_url, run_id)
    try:
        if is_local(root_url):
            return str(run_dir)
        fs, remote_root = url_to_fs(url)
        files = sorted(
            p for p in run_dir.rglob("*") if p.is_file() and p.name != MANIFEST and not p.name.endswith(".tmp")
        )
        for path in files + ([] if manifest_text is not None else [run_dir / MANIFEST]):
            remote = remote_root.rstrip("/") + "/" + path.relative_to(run_dir).as_posix()
            if path.name != MANIFEST and _already_there(fs, remote, path):
                continue
            fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
            _put_atomic(fs, path, remote)
        if manifest_text is not None:
            _pipe_atomic(fs, manifest_text, remote_root.rstrip("/") + "/" + MANIFEST)
    except Exception as err:  # any backend error: keep the local copy and say where it is
        raise StorageError(
            f"could not upload the run to {url}: {type(err).__name__}: {one_line(err)}; the complete "
            f"run is kept at {run_dir} (finish the upload with: tbench upload {run_dir})"
        ) from err
    return url


def discard_staged(run_dir: Path, root_url: str) -> bool:
    """A run stored in a remote root leaves the staging folder once stored: staging is where a run is written while it
    runs, and the copies kept there filled a worker's disk until every run failed (the soak's lost runs). Called only
    after the store succeeded. Returns whether the copy was removed."""
    if is_local(root_url) or os.environ.get(KEEP_STAGED_ENV) == "1":
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return True


def one_line(err: Exception) -> str:
    return " ".join(str(err).split())[:300]


def retry_upload(run_dir: Path, root_url: str | None = None) -> str:
    """Finish the upload of a kept run folder: to `root_url`, else where its manifest says it was going."""
    manifest_path = Path(run_dir) / MANIFEST
    if not manifest_path.is_file():
        raise StorageError(f"{run_dir}: no {MANIFEST}; not a finished run folder")
    manifest = json.loads(manifest_path.read_text())
    run_id = manifest.get("run_id") or Path(run_dir).name
    if root_url is None:
        target = manifest.get("artifact_url") or ""
        if not target.endswith("/" + run_id):
            raise StorageError(f"{manifest_path} does not say where the run was going; give the artifact root")
        root_url = target[: -len(run_id) - 1]
    url = upload_run(Path(run_dir), root_url, run_id)
    add_run_to_dataset(Path(run_dir), root_url, run_id, manifest.get("status"))
    return url


def manifest_text(run_dir: Path, manifest: dict) -> str:
    """The manifest as stored: with every file of the folder, its size and digest."""
    return json.dumps({**manifest, "files": file_entries(run_dir)}, indent=2, default=str)


def write_manifest(run_dir: Path, manifest: dict) -> Path:
    path = run_dir / MANIFEST
    write_local_atomic(path, manifest_text(run_dir, manifest))
    return path
