"""Criteo-style click data for the recommenders: the feature spec, size presets, synthetic data and parquet files.

A sample has 13 numerical features (counts, log1p-transformed as the Criteo preprocessing does), 26 categorical
features (ids into one embedding table each) and a click label. Datasets on disk are parquet files with the columns
`label`, `num_0`..`num_12` and `cat_0`..`cat_25`, read in file-name order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tbench.core.errors import ConfigError

NUM_NUMERICAL = 13
NUM_CATEGORICAL = 26
NUMERICAL_COLUMNS = [f"num_{i}" for i in range(NUM_NUMERICAL)]
CATEGORICAL_COLUMNS = [f"cat_{i}" for i in range(NUM_CATEGORICAL)]
LABEL_COLUMN = "label"
COLUMNS = [LABEL_COLUMN, *NUMERICAL_COLUMNS, *CATEGORICAL_COLUMNS]

# The 26 vocabulary sizes of Criteo 1TB as MLPerf preprocesses it (ids capped at 40M per feature): the shape the
# presets below are scaled from.
CRITEO_1TB_ROWS = (
    39884406,
    39043,
    17289,
    7420,
    20263,
    3,
    7120,
    1543,
    63,
    38532951,
    2953546,
    403346,
    10,
    2208,
    11938,
    155,
    4,
    976,
    14,
    39979771,
    25641295,
    39664984,
    585935,
    12972,
    108,
    36,
)


@dataclass(frozen=True)
class CriteoPreset:
    """One model size: the embedding tables and the MLPs of both DLRM and DCNv2."""

    name: str
    table_rows: tuple[int, ...]  # rows of the embedding table of each categorical feature
    dim: int  # embedding dimension (also the width of DLRM's bottom MLP output)
    bottom_mlp: tuple[int, ...]  # DLRM, on the numerical features; ends in `dim`
    top_mlp: tuple[int, ...]  # DLRM, after the interaction; ends in the 1-unit logit
    cross_layers: int  # DCNv2 full-rank cross layers
    deep_mlp: tuple[int, ...]  # DCNv2, after the cross layers; a 1-unit logit follows

    def __post_init__(self):
        assert len(self.table_rows) == NUM_CATEGORICAL and min(self.table_rows) >= 1
        assert self.bottom_mlp[-1] == self.dim and self.top_mlp[-1] == 1

    @property
    def embedding_params(self) -> int:
        return sum(self.table_rows) * self.dim

    def embedding_bytes(self, bytes_per_value: int = 4) -> int:
        return self.embedding_params * bytes_per_value

    @property
    def interaction_width(self) -> int:
        """DLRM's dot interaction: the strictly lower triangle of the Gram matrix of the 27 vectors."""
        n = NUM_CATEGORICAL + 1
        return n * (n - 1) // 2

    @property
    def dlrm_dense_params(self) -> int:
        return _mlp_params(NUM_NUMERICAL, self.bottom_mlp) + _mlp_params(
            self.dim + self.interaction_width, self.top_mlp
        )

    @property
    def dcnv2_dense_params(self) -> int:
        width = NUM_NUMERICAL + NUM_CATEGORICAL * self.dim
        return self.cross_layers * (width * width + width) + _mlp_params(width, (*self.deep_mlp, 1))

    @property
    def dlrm_params(self) -> int:
        return self.embedding_params + self.dlrm_dense_params

    @property
    def dcnv2_params(self) -> int:
        return self.embedding_params + self.dcnv2_dense_params


def _mlp_params(width: int, layers: tuple[int, ...]) -> int:
    total = 0
    for units in layers:
        total += width * units + units
        width = units
    return total


def _scaled_rows(factor: float, floor: int) -> tuple[int, ...]:
    """Criteo's tables with every one above `floor` rows scaled by `factor` (never below `floor`): the big
    vocabularies grow with the data, the small ones (days, categories of a handful of values) do not."""
    return tuple(r if r <= floor else max(floor, round(r * factor)) for r in CRITEO_1TB_ROWS)


def _rows_for(params: float, dim: int, floor: int) -> tuple[int, ...]:
    """The scale factor (by bisection) whose tables hold `params` embedding parameters."""
    lo, hi = 0.0, 2.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(_scaled_rows(mid, floor)) * dim < params:
            lo = mid
        else:
            hi = mid
    return _scaled_rows(hi, floor)


_BIG_BOTTOM, _BIG_TOP, _BIG_DEEP = (512, 256, 128), (1024, 1024, 512, 256, 1), (1024, 1024, 512, 256)

PRESETS: dict[str, CriteoPreset] = {
    # tests: a few KB of tables, tiny MLPs
    "tiny": CriteoPreset(
        "tiny",
        (
            4,
            2000,
            1500,
            700,
            900,
            5,
            400,
            150,
            60,
            1800,
            1200,
            600,
            10,
            220,
            500,
            155,
            4,
            97,
            14,
            1900,
            1600,
            1750,
            580,
            130,
            108,
            36,
        ),
        dim=8,
        bottom_mlp=(16, 8),
        top_mlp=(32, 16, 1),
        cross_layers=2,
        deep_mlp=(32, 16),
    ),
    # the CPU default: Criteo's shape with the big tables scaled to at most 200k rows (~1M rows, ~65M parameters)
    "small": CriteoPreset(
        "small",
        _scaled_rows(200_000 / max(CRITEO_1TB_ROWS), floor=10_000),
        dim=64,
        bottom_mlp=(256, 128, 64),
        top_mlp=(512, 256, 1),
        cross_layers=3,
        deep_mlp=(512, 256),
    ),
    # The published model sizes (about 4e9 and 22e9 parameters) with the published MLPs (dim 128, DLRM bottom
    # 512-256-128 and top 1024-1024-512-256-1; DCNv2 3 cross layers and deep 1024-1024-512-256). The tables are shaped
    # like Criteo's (the MLPerf 40M-capped vocabularies) and scaled to the published parameter counts: they are not
    # the exact published tables.
    "4B": CriteoPreset(
        "4B",
        _rows_for(4e9, 128, floor=100_000),
        dim=128,
        bottom_mlp=_BIG_BOTTOM,
        top_mlp=_BIG_TOP,
        cross_layers=3,
        deep_mlp=_BIG_DEEP,
    ),
    "22B": CriteoPreset(
        "22B",
        _rows_for(22e9, 128, floor=100_000),
        dim=128,
        bottom_mlp=_BIG_BOTTOM,
        top_mlp=_BIG_TOP,
        cross_layers=3,
        deep_mlp=_BIG_DEEP,
    ),
}


def _power_law_ids(rng: np.random.Generator, n: int, rows: int, exponent: float = 1.2) -> np.ndarray:
    """Ids in [0, rows) with P(id) ~ (id + 1)^-exponent (Zipf-like, bounded): a few ids are hot, most are cold.
    Inverse CDF of the continuous power law on [1, rows + 1), floored."""
    u = rng.random(n)
    a = 1.0 - exponent
    x = (1.0 + u * ((rows + 1.0) ** a - 1.0)) ** (1.0 / a)
    return np.minimum(np.floor(x).astype(np.int64) - 1, rows - 1)


def synthetic_frame(n: int, preset: CriteoPreset | str, seed: int | np.random.Generator = 0):
    """n Criteo-like samples as a DataFrame: `label` (int, ~9-12% clicks), `num_*` float32 log1p of heavy-tailed
    counts (about a fifth missing, filled with 0 as the preprocessing does), `cat_*` int64 power-law ids."""
    import pandas as pd

    preset = PRESETS[preset] if isinstance(preset, str) else preset
    rng = np.random.default_rng(seed)  # a Generator passes through unchanged, so batches can share one stream
    columns: dict[str, np.ndarray] = {}
    for j, name in enumerate(NUMERICAL_COLUMNS):
        # log-normal counts with a per-feature scale and spread; Criteo's counts span from 0 to millions
        mu, sigma = 0.5 + 0.3 * (j % 7), 1.0 + 0.12 * j
        counts = np.floor(rng.lognormal(mu, sigma, n))
        counts[rng.random(n) < 0.2] = 0.0
        columns[name] = np.log1p(counts).astype(np.float32)
    for name, rows in zip(CATEGORICAL_COLUMNS, preset.table_rows):
        columns[name] = _power_law_ids(rng, n, rows)
    # clicks depend a little on the features (hot ids and big counts click more) so a trained model has signal
    logit = (
        -2.2
        + 0.35 * (columns["num_0"] - 1.0)
        + 0.8 * (columns["cat_0"] == 0)
        - 0.5 * (columns["cat_1"] > 10)
        + 0.5 * rng.standard_normal(n)
    )
    label = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    return pd.DataFrame({LABEL_COLUMN: label, **columns})


def frame_inputs(frame, preset: CriteoPreset) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A frame (or pyarrow table) as the model's inputs and the labels; ids past a table's rows are folded in with
    modulo, as hashing would."""
    numerical = np.stack([np.asarray(frame[c], dtype=np.float32) for c in NUMERICAL_COLUMNS], axis=1)
    categorical = np.stack([np.asarray(frame[c], dtype=np.int64) for c in CATEGORICAL_COLUMNS], axis=1)
    categorical = np.mod(categorical, np.asarray(preset.table_rows, dtype=np.int64))
    labels = np.asarray(frame[LABEL_COLUMN]).astype(np.int64)
    return {
        "numerical_features": np.ascontiguousarray(numerical),
        "categorical_features": np.ascontiguousarray(categorical),
    }, labels


def write_parquet_dataset(
    folder: str | Path, n: int, preset: CriteoPreset | str, seed: int = 0, files: int = 2
) -> list[Path]:
    """n synthetic samples as `folder/part-00000.parquet`, ... (pyarrow); returns the paths in read order."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    frame = synthetic_frame(n, preset, seed)
    paths = []
    for k, index in enumerate(np.array_split(np.arange(n), max(1, files))):
        path = folder / f"part-{k:05d}.parquet"
        frame.iloc[index].to_parquet(path, engine="pyarrow", index=False)
        paths.append(path)
    return paths


def parquet_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    if not files:
        why = "no such folder" if not folder.exists() else "no *.parquet files in it"
        raise ConfigError(f"cannot read the Criteo dataset {folder}: {why}")
    return files


def parquet_batches(
    folder: str | Path, preset: CriteoPreset | str, n_samples: int, batch_size: int
) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    """The first n_samples of the parquet files in file-name order, as (inputs, labels) batches of batch_size (the
    last may be smaller; fewer batches when the files hold fewer samples)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    preset = PRESETS[preset] if isinstance(preset, str) else preset
    files = parquet_files(folder)
    for path in files:  # check every file before reading any, so a bad file fails before the run starts
        names = set(pq.read_schema(path).names)
        missing = [c for c in COLUMNS if c not in names]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise ConfigError(
                f"parquet file {path} has no column {missing[0]!r}{more}; "
                f"expected label, num_0..num_{NUM_NUMERICAL - 1}, cat_0..cat_{NUM_CATEGORICAL - 1}"
            )
    pending: list = []
    pending_rows, left = 0, n_samples
    for path in files:
        if left <= 0:
            break
        for record in pq.ParquetFile(path).iter_batches(batch_size=max(1, min(batch_size, 65536)), columns=COLUMNS):
            if left <= 0:
                break
            record = record.slice(0, left)
            left -= record.num_rows
            pending.append(record)
            pending_rows += record.num_rows
            while pending_rows >= batch_size:
                table = pa.Table.from_batches(pending)
                yield frame_inputs(_columns(table.slice(0, batch_size)), preset)
                rest = table.slice(batch_size)
                pending, pending_rows = (rest.to_batches() if rest.num_rows else []), rest.num_rows
    if pending_rows:
        yield frame_inputs(_columns(pa.Table.from_batches(pending)), preset)


def _columns(table) -> dict[str, np.ndarray]:
    return {name: table.column(name).to_numpy() for name in COLUMNS}
