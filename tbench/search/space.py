"""The search's grid: one model configuration (`Candidate`) and the grid of them (`SearchSpace`), with the preferred
batch size rules a grid lists. Pure pydantic: no measuring, no server."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Preferred batch size rules, each resolved against a candidate's max batch size B.
PREFERRED_RULES = {
    "none": lambda b: [],  # no preferred sizes: Triton batches as large as it can, up to B
    "max": lambda b: [b],
    "half": lambda b: [b // 2, b],  # [B/2, B]
    "quarter": lambda b: [b // 4, b // 2, b],  # [B/4, B/2, B]
}


def resolve_preferred(rule: str | list[int], max_batch_size: int) -> tuple[int, ...]:
    """A preferred-sizes rule ('none', 'max', 'half', 'quarter', or explicit sizes) as sizes for one max batch."""
    sizes = PREFERRED_RULES[rule](max_batch_size) if isinstance(rule, str) else list(rule)
    return tuple(sorted({s for s in sizes if 1 <= s <= max_batch_size}))


def preferred_label(rule: str | list[int]) -> str:
    return rule if isinstance(rule, str) else "[" + ",".join(map(str, rule)) + "]"


class Candidate(BaseModel):
    """One model configuration: what Triton's config.pbtxt says about scheduling, and which converted model."""

    model_config = ConfigDict(frozen=True)

    instances: int = Field(ge=1, description="Model instances (instance_group count).")
    max_batch_size: int = Field(ge=0, description="0: a model without a batch axis (SearchSpace.fitted_to).")
    preferred_batch_sizes: tuple[int, ...] = Field((), description="Dynamic batcher preferred sizes; () for none.")
    queue_delay_us: int = Field(0, ge=0, description="Dynamic batcher max_queue_delay_microseconds.")
    format: str = Field(
        "", description="The served variant: a format, or 'format:precision' when several precisions are converted."
    )

    @property
    def cost(self) -> tuple[int, int, int, int]:
        """What serving it takes, smallest first: instances (memory, devices), then max batch, preferred sizes and
        queue delay (latency a request may wait)."""
        return (self.instances, self.max_batch_size, len(self.preferred_batch_sizes), self.queue_delay_us)

    @property
    def key(self) -> str:
        """A stable, file-name-safe identifier: i2_b16_p8-16_d500[_onnx-fp16]."""
        pref = "-".join(map(str, self.preferred_batch_sizes)) or "none"
        key = f"i{self.instances}_b{self.max_batch_size}_p{pref}_d{self.queue_delay_us}"
        return f"{key}_{self.format.replace(':', '-')}" if self.format else key

    @property
    def format_name(self) -> str:
        return self.format.partition(":")[0]

    @property
    def precision(self) -> str:
        return self.format.partition(":")[2]

    def describe(self) -> str:
        pref = list(self.preferred_batch_sizes) if self.preferred_batch_sizes else "none"
        fmt = f", format {self.format}" if self.format else ""
        return (
            f"instances {self.instances}, max batch {self.max_batch_size}, preferred {pref}, "
            f"queue delay {self.queue_delay_us} us{fmt}"
        )


class SearchSpace(BaseModel):
    """The grid: every combination of the listed values (duplicates, such as 'half' and 'max' at max batch 1, once).
    Ordered dimensions are searched in order of their values; formats are unordered."""

    instances: list[int] = Field([1, 2], description="Instance counts to try.")
    max_batch_sizes: list[int] = Field([1, 2, 4, 8, 16], description="Max batch sizes to try.")
    preferred: list[str | list[int]] = Field(
        ["none", "max"],
        description="Preferred batch size choices: 'none', 'max' "
        "([B]), 'half' ([B/2, B]), 'quarter' ([B/4, B/2, B]) or explicit sizes.",
    )
    queue_delays_us: list[int] = Field([0, 500, 2000], description="Dynamic batcher max queue delays to try, in us.")
    formats: list[str] = Field(
        [""], description="Served variants: formats, or 'format:precision'; [''] for the one served model."
    )

    @field_validator("instances", "max_batch_sizes", "queue_delays_us")
    @classmethod
    def _sorted_unique(cls, values: list[int]) -> list[int]:
        if not values:
            raise ValueError("needs at least one value")
        return sorted(set(values))

    @field_validator("preferred")
    @classmethod
    def _known_rules(cls, values: list) -> list:
        if not values:
            raise ValueError("needs at least one preferred batch size choice")
        for v in values:
            if isinstance(v, str) and v not in PREFERRED_RULES:
                raise ValueError(
                    f"unknown preferred batch size rule {v!r}; known: {', '.join(PREFERRED_RULES)} "
                    "or sizes (4+8 on the command line)"
                )
        return values

    @model_validator(mode="after")
    def _check(self) -> SearchSpace:
        batches = self.max_batch_sizes == [0] or min(self.max_batch_sizes) >= 1  # [0]: no batch axis (fitted_to)
        if min(self.instances) < 1 or not batches or min(self.queue_delays_us) < 0:
            raise ValueError("instances and max batch sizes must be >= 1, queue delays >= 0")
        if not self.formats or len(set(self.formats)) != len(self.formats):
            raise ValueError("formats must be a non-empty list without duplicates")
        return self

    def fitted_to(self, max_batch_size: int) -> SearchSpace:
        """The grid a model can take: one without a batch axis (max_batch_size 0) varies only what does not batch
        (instances, formats); max batch, preferred sizes and the batcher's delay are dropped."""
        if max_batch_size > 0:
            return self
        return self.model_copy(update={"max_batch_sizes": [0], "preferred": ["none"], "queue_delays_us": [0]})

    # the search's coordinate axes, in the order a grid index lists them
    AXES: ClassVar[tuple[str, ...]] = ("format", "instances", "max_batch_size", "preferred", "queue_delay_us")

    def axis_values(self) -> dict[str, list]:
        return {
            "format": self.formats,
            "instances": self.instances,
            "max_batch_size": self.max_batch_sizes,
            "preferred": self.preferred,
            "queue_delay_us": self.queue_delays_us,
        }

    def shape(self) -> tuple[int, ...]:
        values = self.axis_values()
        return tuple(len(values[a]) for a in self.AXES)

    def at(self, index: tuple[int, ...]) -> Candidate:
        """The candidate at a grid index (format, instances, max batch, preferred, delay)."""
        f, i, b, p, d = index
        batch = self.max_batch_sizes[b]
        return Candidate(
            instances=self.instances[i],
            max_batch_size=batch,
            preferred_batch_sizes=resolve_preferred(self.preferred[p], batch),
            queue_delay_us=self.queue_delays_us[d],
            format=self.formats[f],
        )

    def indices(self) -> Iterable[tuple[int, ...]]:
        return itertools.product(*(range(n) for n in self.shape()))

    def grid(self) -> list[Candidate]:
        """Every distinct candidate, in a stable order (format, instances, max batch, preferred, delay)."""
        seen: dict[str, Candidate] = {}
        for index in self.indices():
            c = self.at(index)
            seen.setdefault(c.key, c)
        return list(seen.values())

    def nearest(
        self,
        instances: int,
        max_batch_size: int,
        preferred_batch_sizes: Iterable[int] = (),
        queue_delay_us: int = 0,
        format: str | None = None,
    ) -> tuple[int, ...]:
        """The grid index nearest to a configuration (e.g. a guide's default), dimension by dimension: numbers by
        log distance, preferred sizes by the rule that resolves closest, the format by name (else the first)."""

        def closest(values: list[int], target: float) -> int:
            return min(range(len(values)), key=lambda i: (abs(math.log1p(values[i]) - math.log1p(target)), values[i]))

        b = closest(self.max_batch_sizes, max_batch_size)
        want = set(preferred_batch_sizes)
        batch = self.max_batch_sizes[b]
        p = min(
            range(len(self.preferred)),
            key=lambda i: len(set(resolve_preferred(self.preferred[i], batch)) ^ {s for s in want if s <= batch}),
        )
        f = self.formats.index(format) if format in self.formats else 0
        return (f, closest(self.instances, instances), b, p, closest(self.queue_delays_us, queue_delay_us))

    def middle(self) -> tuple[int, ...]:
        """The default start: the first format and preferred choice, the middle of each numeric dimension."""
        _, ni, nb, _, nd = self.shape()
        return (0, (ni - 1) // 2, nb // 2, 0, (nd - 1) // 2)
