"""A cache folder kept under its bound: least recently used entries first, never one in use, half-written leftovers
of killed runs removed once stale; and the conversion cache bounded through it."""

from __future__ import annotations

import os
import time

import pytest

from tbench.core import disk_cache
from tbench.core.disk_cache import IN_USE_S, LIMIT_ENV, STALE_S, max_bytes, trim, used
from tbench.core.errors import ConfigError

NOW = 1_800_000_000.0
DAY = 86400.0


def entry(root, name, size, age_s):
    folder = root / name
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "model.bin").write_bytes(b"x" * size)
    os.utime(folder, (NOW - age_s, NOW - age_s))
    return folder


def test_the_least_recently_used_go_first_until_under_the_bound(tmp_path):
    old = entry(tmp_path, "old", 400, 3 * DAY)
    middle = entry(tmp_path, "middle", 400, 2 * DAY)
    new = entry(tmp_path, "new", 400, 1 * DAY)
    assert trim(tmp_path, limit=900, now=NOW) == [old]
    assert not old.exists() and middle.exists() and new.exists()
    assert trim(tmp_path, limit=900, now=NOW) == []  # under the bound: nothing more


def test_using_an_entry_keeps_it(tmp_path):
    old = entry(tmp_path, "old", 400, 3 * DAY)
    middle = entry(tmp_path, "middle", 400, 2 * DAY)
    used(old)  # a cache hit: now the most recent
    os.utime(old, (NOW - 60 * 60 * 2, NOW - 60 * 60 * 2))  # two hours ago (out of the in-use window)
    assert trim(tmp_path, limit=500, now=NOW) == [middle]


def test_an_entry_in_use_or_just_written_is_never_removed(tmp_path):
    busy = entry(tmp_path, "busy", 400, IN_USE_S / 2)  # another run may be copying from it
    written = entry(tmp_path, "written", 400, 5 * DAY)
    assert trim(tmp_path, keep=written, limit=100, now=NOW) == []
    assert busy.exists() and written.exists()  # over the bound, and says nothing: only what is free to go goes


def test_half_written_leftovers_go_once_stale(tmp_path):
    stale = entry(tmp_path, ".abc.123.tmp", 10, STALE_S + 60)
    fresh = entry(tmp_path, "def.partial", 10, 60)  # a fetch in progress
    trash = entry(tmp_path, ".trash-x.99", 10, 1)  # a removal that was killed half-way
    removed = trim(tmp_path, limit=None, now=NOW)
    assert set(removed) == {stale, trash}
    assert fresh.exists()


def test_the_bound_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    assert max_bytes() == int(disk_cache.DEFAULT_MAX_GIB * 2**30)
    monkeypatch.setenv(LIMIT_ENV, "0.5")
    assert max_bytes() == 2**29
    monkeypatch.setenv(LIMIT_ENV, "0")
    assert max_bytes() is None  # no bound
    for bad in ("lots", "-1", "nan", "inf"):
        monkeypatch.setenv(LIMIT_ENV, bad)
        with pytest.raises(ConfigError, match=f"{LIMIT_ENV}=.* is not a size in GiB: set it to e.g. 20") as err:
            max_bytes()
        assert "\n" not in str(err.value)


def test_a_conversion_cache_over_its_bound_drops_its_oldest_conversion(
    small_adapter, small_module, tmp_path, monkeypatch
):
    from tbench.core.enums import Format
    from tbench.core.runtimes import source_digest
    from tbench.stages.converters.registry import ConversionOptions
    from tbench.stages.export import cache_root, export_model

    monkeypatch.setenv("TBENCH_CACHE_DIR", str(tmp_path / "cache"))
    digest = source_digest("pytorch", small_module)
    first = export_model(
        small_adapter, small_module, Format.ONNX, tmp_path / "a", digest, ConversionOptions(onnx_opset=16)
    )
    (oldest,) = list(cache_root().iterdir())
    three_days_ago = time.time() - 3 * DAY
    os.utime(oldest, (three_days_ago, three_days_ago))
    monkeypatch.setenv(LIMIT_ENV, str(1 / 2**30))  # 1 byte: only the conversion just written stays
    second = export_model(
        small_adapter, small_module, Format.ONNX, tmp_path / "b", digest, ConversionOptions(onnx_opset=14)
    )
    assert not first.cached and not second.cached
    assert not oldest.exists() and len(list(cache_root().iterdir())) == 1
    assert os.path.exists(first.path)  # the run's own copy is not the cache's
