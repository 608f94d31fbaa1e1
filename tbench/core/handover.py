"""A user's files handed to a pool's worker through the artifact store: `tbench submit --model-file` uploads the model
file (with every file it references: an ONNX file's external data, a SavedModel's folder) and the input samples under
their content digest, and sends their URLs; the worker fetches them into its cache and checks every byte before it
reads them.

    <root>/inputs/<digest>/handover.json   {"entry": "model.onnx", "files": {"model.onnx": "<sha256>", ...}}
                                           (+ "folders": [...], a folder's empty folders, where it has any)
    <root>/inputs/<digest>/model.onnx ...

The digest is the sha256 of handover.json's "files" (names and contents), so a file is stored once however often it is
submitted, and a URL names exactly the bytes it was made from. A worker's copy lives under
~/.cache/tbench/inputs/<digest>/ and is used again only once every file has been checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from tbench.core import disk_cache
from tbench.core.errors import ConfigError, StorageError
from tbench.core.storage import error_cause, file_sha256, is_remote, join, store_errors, url_to_fs

INPUTS_DIR = "inputs"
MANIFEST = "handover.json"
CHECKED = ".checked"  # written last in a worker's copy: every file of it was verified
CACHE_ENV = "TBENCH_INPUTS_CACHE"  # where a worker keeps fetched uploads (~/.cache/tbench/inputs)


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "tbench" / INPUTS_DIR))


def handed_files(path: Path) -> dict[str, Path]:
    """{name relative to the folder `path` is in: file} of what must travel with `path`: a folder's every file, or a
    file and the external data it references."""
    from tbench.core.onnx_files import onnx_external_files

    path = path.resolve()
    if path.is_dir():
        return {f.relative_to(path.parent).as_posix(): f for f in sorted(path.rglob("*")) if f.is_file()}
    if not path.is_file():
        raise ConfigError(f"{path} does not exist")
    files = {path.name: path}
    for location in onnx_external_files(path):
        source = path.parent / location
        if not source.is_file():
            raise ConfigError(f"{path} keeps weights in {location}, which is not next to it ({source})")
        files[Path(location).as_posix()] = source
    return files


def handed_folders(path: Path) -> list[str]:
    """The empty folders that travel with a folder `path` (a Triton ensemble's version folder holds no file), named
    relative to the folder `path` is in."""
    path = path.resolve()
    if not path.is_dir():
        return []
    return sorted(d.relative_to(path.parent).as_posix() for d in path.rglob("*") if d.is_dir() and not any(d.iterdir()))


def digest_of(sums: dict[str, str], folders: list[str] = ()) -> str:
    """What names an upload: its files' names and contents, and its empty folders where it has any (an upload without
    them keeps the digest it always had)."""
    listed = sorted(sums.items()) if not folders else [sorted(sums.items()), sorted(folders)]
    return hashlib.sha256(json.dumps(listed).encode()).hexdigest()


def upload(path: str | Path, root: str) -> str:
    """Puts `path` and what travels with it under `<root>/inputs/<digest>/` (once: an upload already there is kept) and
    returns the URL a worker fetches it by."""
    path = Path(path)
    files = handed_files(path)
    sums = {name: file_sha256(f) for name, f in files.items()}
    folders = handed_folders(path)
    digest = digest_of(sums, folders)
    entry = path.resolve().name
    target = join(root, INPUTS_DIR, digest)
    fs, base = url_to_fs(target)
    try:
        if not fs.exists(f"{base}/{MANIFEST}"):
            for name, f in files.items():
                fs.put_file(str(f), f"{base}/{name}")
            # the manifest last: its presence says the upload is whole
            manifest = {"entry": entry, "files": sums, **({"folders": folders} if folders else {})}
            fs.pipe_file(f"{base}/{MANIFEST}", json.dumps(manifest, indent=1).encode())
    except store_errors() as err:
        raise StorageError(f"cannot upload {path} to {target}: {error_cause(err)}") from None
    return f"{target}/{entry}"


def fetch(url: str) -> Path:
    """The local copy of an uploaded file (`<root>/inputs/<digest>/<entry>`), fetched once into the cache and checked
    file by file against the manifest and the digest its URL names."""
    folder, _, entry = url.rstrip("/").rpartition("/")
    digest = folder.rpartition("/")[2]
    local = cache_root() / digest
    if (local / CHECKED).is_file():
        disk_cache.used(local)
        return local / entry
    fs, base = url_to_fs(folder)
    try:
        manifest = json.loads(fs.cat_file(f"{base}/{MANIFEST}"))
    except FileNotFoundError:
        raise ConfigError(f"{url}: no upload there ({MANIFEST} missing): submit the file again") from None
    except store_errors() as err:
        raise StorageError(f"cannot fetch {url}: {error_cause(err)}") from None
    sums, folders = manifest["files"], manifest.get("folders", [])
    if digest_of(sums, folders) != digest:
        raise ConfigError(f"{url}: its manifest does not match the digest {digest[:12]}... its URL names")
    shutil.rmtree(local, ignore_errors=True)  # a copy that was not checked to the end starts again
    partial = local.with_name(local.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        for name, expected in sums.items():
            target = partial / name
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(f"{base}/{name}", str(target))
            if file_sha256(target) != expected:
                raise ConfigError(f"{url}: {name} does not have the content it was uploaded with (sha256 differs)")
    except store_errors() as err:
        raise StorageError(f"cannot fetch {url}: {error_cause(err)}") from None
    for folder in folders:
        (partial / folder).mkdir(parents=True, exist_ok=True)
    (partial / CHECKED).write_text(digest)
    try:
        partial.rename(local)
    except OSError:  # another run on this machine fetched it first: theirs is as good
        if not (local / CHECKED).is_file():
            raise
        shutil.rmtree(partial, ignore_errors=True)
    disk_cache.trim(cache_root(), keep=local)
    return local / manifest["entry"]


def local_path(path: str | None) -> str | None:
    """A request's file as this machine reads it: fetched when it is an upload's URL, else as given."""
    return str(fetch(path)) if is_remote(path) else path


def hand_over_path(path: str, root: str) -> str:
    """Where another machine's worker reads `path`: its upload under `root` when the root is shared, else its absolute
    path (a worker on this machine); an upload's URL as it is."""
    if is_remote(path):
        return path
    return upload(path, root) if is_remote(root) else str(Path(path).resolve())
