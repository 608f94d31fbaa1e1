"""The artifact root as an fsspec filesystem, with credentials from the environment or a Prefect block.

Credentials are never part of a URL, a log line or a manifest:
- the environment: s3fs/botocore read ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (or a profile, or the node's
  role) and ``AWS_ENDPOINT_URL`` for an S3-compatible endpoint (MinIO, moto, Ceph...);
- a Prefect block: ``TBENCH_STORAGE_BLOCK=<name>`` names a Prefect ``Secret`` block whose value is a JSON object of
  fsspec storage options (e.g. ``{"key": ..., "secret": ..., "endpoint_url": ...}``), so workers of a pool share
  credentials kept in the Prefect server rather than in their environment.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache

import fsspec

from tbench.core.errors import StorageError, one_line

STORAGE_BLOCK_ENV = "TBENCH_STORAGE_BLOCK"


@lru_cache(maxsize=4)
def _block_options(name: str) -> tuple[tuple[str, object], ...]:
    from prefect.blocks.system import Secret

    try:
        value = Secret.load(name).get()
    except Exception as err:  # the error names the block, never its value
        raise StorageError(
            f"cannot read the storage credentials block {name!r} ({STORAGE_BLOCK_ENV}): {type(err).__name__}"
        ) from None
    if not isinstance(value, dict):
        raise StorageError(f"the storage credentials block {name!r} must hold a JSON object of fsspec options")
    return tuple(sorted(value.items()))


def file_sha256(path) -> str:
    """The sha256 (hex) of a file's bytes, read in 1 MiB chunks: what the manifest, the point cache and the handover
    record of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_remote(url: str | None) -> bool:
    """An fsspec URL of another machine (s3://, gs://...), not a local folder or file:// path."""
    return bool(url) and "://" in url and not url.startswith("file://")


def storage_options(url: str) -> dict:
    """fsspec options for a remote URL: the Prefect block's when TBENCH_STORAGE_BLOCK is set, else none (the
    backend reads the environment itself)."""
    name = os.environ.get(STORAGE_BLOCK_ENV)
    if not name or not is_remote(url):
        return {}
    return dict(_block_options(name))


def url_to_fs(url: str, **extra):
    """(filesystem, path) for a local folder or any fsspec URL; a clear StorageError for what fsspec cannot open.
    `extra` are backend options the caller needs (a credentials block's options win over them)."""
    options = {**extra, **storage_options(url)}
    if is_remote(url):
        # fsspec reuses a filesystem made with the same arguments, but s3fs reads the endpoint and credentials from
        # the environment when it is made: a cached one would keep talking to yesterday's endpoint
        options.setdefault("skip_instance_cache", True)
    try:
        return fsspec.core.url_to_fs(url, **options)
    except (ValueError, ImportError) as err:  # unknown protocol, or its fsspec backend is not installed
        raise StorageError(f"cannot use artifact root {url!r}: {err}") from err


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *(p.strip("/") for p in parts)])


def store_errors() -> tuple[type[BaseException], ...]:
    """What reading or writing a store can raise: OSError (s3fs translates S3's answers into FileNotFoundError,
    PermissionError...; timeouts are OSErrors too) and what s3fs lets through as it is: botocore's own errors
    (EndpointConnectionError when the endpoint is down, ConnectTimeoutError, NoCredentialsError) and aiohttp's."""
    errors: list[type[BaseException]] = [OSError]
    try:
        from botocore.exceptions import BotoCoreError

        errors.append(BotoCoreError)
    except ImportError:
        pass
    try:
        from aiohttp import ClientError

        errors.append(ClientError)
    except ImportError:
        pass
    return tuple(errors)


def error_cause(err: BaseException, limit: int = 300) -> str:
    """An error as one line: its type and message (a botocore or aiohttp message can span lines)."""
    text = " ".join(str(err).split()) or type(err).__name__
    return one_line(f"{type(err).__name__}: {text}" if text != type(err).__name__ else text, limit)
