"""What a run's points were measured at, as result labels: the dynamic dims' shapes and the input data. A model's speed
depends on both (an NLP model at 16 tokens looks far faster than at 512; real samples are not synthetic ones), so
`tbench compare` and the history's series match points on them. A model without a dynamic dim has no shapes label
(its shapes are the model's); runs stored before these labels have neither and match on the other keys."""

from __future__ import annotations

from tbench.core.input_data import InputSamples
from tbench.core.iospec import IoSpec

SYNTHETIC = "synthetic"


def shapes_label(spec: IoSpec, shapes: dict[str, list[int]] | None, varying: tuple[str, ...] = ()) -> str | None:
    """`input_ids=128; attention_mask=128` for each input with a dynamic dim (its measured non-batch shape, dims joined
    by x), `varies` where each request carried its own sample's shape; None where no input has a dynamic dim."""
    shapes = shapes or {}
    parts = []
    for t in spec.inputs:
        if -1 not in t.shape:
            continue
        if t.name in varying:
            parts.append(f"{t.name}=varies")
        elif t.name in shapes:
            parts.append(f"{t.name}={'x'.join(str(d) for d in shapes[t.name])}")
    return "; ".join(parts) or None


def input_data_label(given: InputSamples | None) -> str:
    """The user's samples by content (`sha256:` and 16 hex digits, whatever file form they came in), or `synthetic`."""
    return f"sha256:{given.digest()[:16]}" if given is not None else SYNTHETIC
