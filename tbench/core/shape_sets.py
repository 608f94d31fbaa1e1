"""The user's --shape values as the shape sets a run measures one after another (a sequence-length sweep):
`--shape input_ids:64,128,256` gives an input of rank 1 three shapes; an input of rank r takes r values per shape.
Inputs whose dynamic dims share a name in the model (ONNX dim_param: input_ids and attention_mask share `sequence`)
take the size the user gave one of them, so they move together."""

from __future__ import annotations

from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec


def shape_sets(
    spec: IoSpec, given: dict[str, list[int]] | None, dim_names: dict[str, list[str]] | None = None
) -> list[dict[str, list[int]]]:
    """One dict of input shapes per measured shape set, in the order given; [{}] when nothing is given."""
    given, dim_names = given or {}, dim_names or {}
    names = spec.input_names()
    if unknown := sorted(set(given) - set(names)):
        raise ConfigError(
            f"--shape names unknown input(s) {', '.join(unknown)}; the model's inputs are {', '.join(names)}"
        )
    per_input = {}
    for t in spec.inputs:
        if t.name not in given:
            continue
        values, rank = list(given[t.name]), len(t.shape)
        if rank == 0 or not values or len(values) % rank:
            raise ConfigError(
                f"--shape {t.name}:{','.join(map(str, values))} does not split into shapes of {t.name}'s rank {rank} "
                f"({','.join(map(str, t.shape))}): give {rank} value(s) per shape, the shapes one after another"
            )
        per_input[t.name] = [values[i : i + rank] for i in range(0, len(values), rank)]
    swept = {name: len(shapes) for name, shapes in per_input.items() if len(shapes) > 1}
    if len(set(swept.values())) > 1:
        counts = ", ".join(f"{name} {n}" for name, n in swept.items())
        raise ConfigError(f"swept inputs move together, one shape of each per set: give each as many shapes ({counts})")
    sets = []
    for i in range(max(swept.values(), default=1)):
        chosen = {name: shapes[i if len(shapes) > 1 else 0] for name, shapes in per_input.items()}
        sets.append({**chosen, **_sharing(spec, chosen, dim_names)})
    return sets


def _sharing(spec: IoSpec, chosen: dict[str, list[int]], dim_names: dict[str, list[str]]) -> dict[str, list[int]]:
    """The shapes of inputs the user did not name whose every dynamic dim shares its name with a dim they sized."""
    sizes = {}
    for name, shape in chosen.items():
        for dim_name, size in zip(dim_names.get(name, []), shape):
            if dim_name:
                sizes.setdefault(dim_name, size)
    shared = {}
    for t in spec.inputs:
        named = dim_names.get(t.name, [])
        if t.name in chosen or -1 not in t.shape or len(named) != len(t.shape):
            continue
        if all(d != -1 or (n and n in sizes) for d, n in zip(t.shape, named)):
            shared[t.name] = [sizes[n] if d == -1 else d for d, n in zip(t.shape, named)]
    return shared


def shape_tags(sets: list[dict[str, list[int]]]) -> list[str]:
    """Each shape set in file and stage names, by the inputs whose shape changes across the sets (ids128,
    features16x8); "" for a single set."""
    if len(sets) < 2:
        return [""] * len(sets)
    moving = sorted({name for s in sets for name in s if any(o.get(name) != s[name] for o in sets)})
    return ["_".join(f"{name}{'x'.join(map(str, s[name]))}" for name in moving if name in s) for s in sets]


def guessed_shapes_line(guessed: dict[str, list[int]]) -> str:
    """The dims tbench chose for a model file's dynamic dims, and the --shape line that chooses them: on the terminal
    before the first point and in the report's summary, as the figures hold at those shapes only."""
    named = ", ".join(f"{name} at {dims}" for name, dims in guessed.items())
    line = " ".join(f"--shape {name}:{','.join(map(str, dims))}" for name, dims in guessed.items())
    return f"dynamic dims no --shape sets are measured as {named}; to choose: {line}"
