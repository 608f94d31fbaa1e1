"""The Outbrain click-prediction feature set that Wide & Deep reads: its spec, synthetic data and a parquet reader.

Column names and hash-bucket sizes follow the TF2 Wide & Deep guide's preprocessed parquet layout, so its validation
files load as they are: one int64 column per one-hot feature, one list<int64> column of fixed length (hotness) per
multi-hot feature with 0 as padding ("none"), float32 numerical columns, `clicked` and `display_id`. The "small" preset
divides every cardinality by 100 (min 4) for fast tests.

Ids outside a feature's cardinality are folded into range as the training pipeline's hashing does: one-hot ids modulo
the cardinality; multi-hot ids into 1..cardinality-1 (`1 + (id - 1) mod (cardinality - 1)`) so that 0 stays padding
and in-range ids are unchanged. The model applies the same folding in its graph (see `model_adapters.widedeep`), so
served requests with any id are safe too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tbench.core.errors import ConfigError

_FULL_ONEHOT = (
    ("document_id", 300000),
    ("ad_id", 250000),
    ("document_id_promo", 100000),
    ("campaign_id", 5000),
    ("source_id", 4000),
    ("source_id_promo", 4000),
    ("geo_location", 2500),
    ("advertiser_id", 2500),
    ("geo_location_state", 2000),
    ("publisher_id", 1000),
    ("publisher_id_promo", 1000),
    ("geo_location_country", 300),
    ("platform", 4),
)
_FULL_MULTIHOT = (("topic_id_list", 350, 3), ("entity_id_list", 10000, 3), ("category_id_list", 100, 3))
# popularity (click-through rates and log-scaled view counts), event-document/ad-document similarities and
# log-scaled document ages, all scaled to [0, 1] by the preprocessing
_NUMERICAL = (
    "document_id_document_id_promo_sim_categories",
    "document_id_document_id_promo_sim_topics",
    "document_id_document_id_promo_sim_entities",
    "document_id_promo_ctr",
    "publisher_id_promo_ctr",
    "source_id_promo_ctr",
    "document_id_promo_count",
    "publish_time_days_since_published",
    "ad_id_ctr",
    "advertiser_id_ctr",
    "campaign_id_ctr",
    "ad_id_count",
    "publish_time_promo_days_since_published",
)
# crossed features of the wide part: (feature a, feature b, hash buckets); ad x country and campaign x state are
# sparse (75M and 10M combinations hashed into far fewer buckets), publisher x platform is dense (4000 combinations)
_FULL_CROSSES = (
    ("ad_id", "geo_location_country", 300000),
    ("publisher_id", "platform", 4000),
    ("campaign_id", "geo_location_state", 100000),
)


@dataclasses.dataclass(frozen=True)
class OutbrainSpec:
    onehot: tuple[tuple[str, int], ...]  # (name, cardinality)
    multihot: tuple[tuple[str, int, int], ...]  # (name, cardinality, hotness); id 0 is padding
    numerical: tuple[str, ...]
    crosses: tuple[tuple[str, str, int], ...]  # (feature a, feature b, buckets), for the wide part
    label: str = "clicked"
    group: str = "display_id"

    @property
    def cardinalities(self) -> dict[str, int]:
        return {name: card for name, card, *_ in self.onehot + self.multihot}

    @property
    def feature_names(self) -> list[str]:
        """Model inputs in order: one-hot, multi-hot, numerical."""
        return [n for n, _ in self.onehot] + [n for n, _, _ in self.multihot] + list(self.numerical)

    @property
    def columns(self) -> list[str]:
        return self.feature_names + [self.group, self.label]


def _scaled(card: int) -> int:
    return max(4, card // 100)


SPECS = {
    "full": OutbrainSpec(_FULL_ONEHOT, _FULL_MULTIHOT, _NUMERICAL, _FULL_CROSSES),
    "small": OutbrainSpec(
        tuple((n, _scaled(c)) for n, c in _FULL_ONEHOT),
        tuple((n, _scaled(c), h) for n, c, h in _FULL_MULTIHOT),
        _NUMERICAL,
        tuple((a, b, _scaled(k)) for a, b, k in _FULL_CROSSES),
    ),
}


def fold_onehot(ids: np.ndarray, card: int) -> np.ndarray:
    return np.mod(ids, card)


def fold_multihot(ids: np.ndarray, card: int) -> np.ndarray:
    return np.where(ids == 0, 0, 1 + np.mod(ids - 1, card - 1))


def _display_sizes(n: int, rng: np.random.Generator) -> np.ndarray:
    """Displays of 2..12 consecutive ads covering exactly n rows (a lone row only when n == 1)."""
    sizes, left = [], n
    while left:
        size = int(rng.integers(2, 13))
        if left - size < 2:  # the rest would be empty or a single ad: take it all, or leave exactly 2
            size = left if left <= 12 else left - 2
        sizes.append(size)
        left -= size
    return np.array(sizes, dtype=np.int64)


def synthetic_frame(n: int, spec: OutbrainSpec, seed: int = 0):
    """n rows in the parquet layout: uniform ids, 0..hotness real ids per multi-hot row (the rest padding), numericals
    in [0, 1), and displays of 2..12 consecutive ads with exactly one click each."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    data = {}
    for name, card in spec.onehot:
        data[name] = rng.integers(0, card, size=n, dtype=np.int64)
    for name, card, hot in spec.multihot:
        ids = rng.integers(1, card, size=(n, hot), dtype=np.int64)
        ids[np.arange(hot)[None, :] >= rng.integers(0, hot + 1, size=(n, 1))] = 0
        data[name] = list(ids)
    for name in spec.numerical:
        data[name] = rng.random(n, dtype=np.float32)
    sizes = _display_sizes(n, rng)
    starts = np.cumsum(sizes) - sizes
    data[spec.group] = np.repeat(np.arange(1, sizes.size + 1, dtype=np.int64), sizes)
    clicked = np.zeros(n, dtype=np.int64)
    clicked[starts + (rng.random(sizes.size) * sizes).astype(np.int64)] = 1
    data[spec.label] = clicked
    return pd.DataFrame(data)


def _arrow_table(frame, spec: OutbrainSpec):
    import pyarrow as pa

    arrays = [
        pa.array(list(frame[n]), type=pa.list_(pa.int64()))
        if n in {m for m, _, _ in spec.multihot}
        else pa.array(frame[n].to_numpy())
        for n in spec.columns
    ]
    return pa.Table.from_arrays(arrays, names=spec.columns)


def write_parquet_dataset(folder: str | Path, n: int, spec: OutbrainSpec, seed: int = 0, files: int = 2) -> list[Path]:
    """synthetic_frame(n, spec, seed) split in row order over `files` parquet files in folder/valid/."""
    import pyarrow.parquet as pq

    valid = Path(folder) / "valid"
    valid.mkdir(parents=True, exist_ok=True)
    frame = synthetic_frame(n, spec, seed)
    paths = []
    for i, rows in enumerate(np.array_split(np.arange(n), files)):
        path = valid / f"part_{i}.parquet"
        pq.write_table(_arrow_table(frame.iloc[rows], spec), path)
        paths.append(path)
    return paths


def _multihot_matrix(column, hot: int) -> np.ndarray:
    """A list column (variable or fixed length, nulls allowed) as an (n, hot) int64 matrix: truncated or 0-padded."""
    import pyarrow.compute as pc

    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    n = len(column)
    lengths = pc.list_value_length(column).fill_null(0).to_numpy().astype(np.int64)
    values = column.flatten().fill_null(0).to_numpy().astype(np.int64)
    rows = np.repeat(np.arange(n), lengths)
    pos = np.arange(values.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out = np.zeros((n, hot), dtype=np.int64)
    keep = pos < hot
    out[rows[keep], pos[keep]] = values[keep]
    return out


def table_batch(table, spec: OutbrainSpec) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Model inputs (one-hot (n, 1) int64, multi-hot (n, hotness) int64, numerical (n, 1) float32, ids folded into
    range) and labels (n, 2) int64: [display_id, clicked]."""

    def plain(name, dtype):
        return table.column(name).fill_null(0).to_numpy().astype(dtype).reshape(-1, 1)

    inputs = {name: fold_onehot(plain(name, np.int64), card) for name, card in spec.onehot}
    inputs |= {
        name: fold_multihot(_multihot_matrix(table.column(name), hot), card) for name, card, hot in spec.multihot
    }
    inputs |= {name: plain(name, np.float32) for name in spec.numerical}
    labels = np.concatenate([plain(spec.group, np.int64), plain(spec.label, np.int64)], axis=1)
    return inputs, labels


def frame_batch(frame, spec: OutbrainSpec) -> tuple[dict[str, np.ndarray], np.ndarray]:
    return table_batch(_arrow_table(frame, spec), spec)


def parquet_files(folder: str | Path) -> list[Path]:
    root = Path(folder)
    if not root.is_dir():
        raise ConfigError(f"Outbrain data folder {root} does not exist")
    base = root / "valid" if (root / "valid").is_dir() else root
    files = sorted(base.glob("*.parquet"))
    if not files:
        raise ConfigError(f"no parquet files in {base} (expected the preprocessed Outbrain validation set, *.parquet)")
    return files


def parquet_batches(
    folder: str | Path, spec: OutbrainSpec, n_samples: int, batch_size: int
) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    """The first n_samples rows of folder/valid/*.parquet (or folder/*.parquet) in file order, in batches."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pending, have = [], 0
    for path in parquet_files(folder):
        if have >= n_samples:
            break
        parquet = pq.ParquetFile(path)
        missing = [c for c in spec.columns if c not in parquet.schema_arrow.names]
        if missing:
            raise ConfigError(
                f"{path} has no column {missing[0]!r}"
                + (f" (nor {len(missing) - 1} more the model needs)" if len(missing) > 1 else "")
            )
        for record_batch in parquet.iter_batches(batch_size=max(batch_size, 1024), columns=spec.columns):
            record_batch = record_batch.slice(0, n_samples - have)
            pending.append(record_batch)
            have += record_batch.num_rows
            while sum(b.num_rows for b in pending) >= batch_size:
                table = pa.Table.from_batches(pending)
                yield table_batch(table.slice(0, batch_size), spec)
                pending = table.slice(batch_size).to_batches()
            if have >= n_samples:
                break
    if pending and sum(b.num_rows for b in pending):
        yield table_batch(pa.Table.from_batches(pending), spec)
