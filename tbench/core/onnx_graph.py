"""What tbench reads of an ONNX graph beyond its inputs and outputs: the embedding tables its integer inputs index
(their synthetic values stay in range) and the names its dims share (inputs sized together)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

# ops that pass an index tensor on unchanged in value (input 0 to output 0)
_VALUE_PRESERVING = {"Identity", "Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Transpose"}


def onnx_file_table_rows(path: Path, names: list[str]) -> dict[str, int]:
    """onnx_table_rows of an ONNX file (its weights' dims are in the graph: external data is not read); {} for a file
    that does not parse, whose server says why if it must."""
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:
        return {}
    return onnx_table_rows(graph, names)


def onnx_table_rows(graph: Any, names: list[str]) -> dict[str, int]:
    """Per integer input that indexes a constant table (Gather(table, ids), as an exported embedding lookup is), the
    table's size along the gathered axis: its valid indices are 0..rows-1. Followed through value-preserving ops only;
    the fewest rows when it indexes several tables; inputs not seen indexing a table are left out."""
    tables = {i.name: list(i.dims) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":  # a tensor constant (value_float, value_ints, ... are not tables)
                    tables[node.output[0]] = list(attribute.t.dims)
    consumers: dict[str, list[tuple[Any, int]]] = defaultdict(list)
    for node in graph.node:
        for slot, name in enumerate(node.input):
            consumers[name].append((node, slot))
    found = {}
    for name in names:
        rows, frontier, seen = [], [name], set()
        while frontier:
            tensor = frontier.pop()
            if tensor in seen:
                continue
            seen.add(tensor)
            for node, slot in consumers.get(tensor, []):
                if node.op_type in _VALUE_PRESERVING and slot == 0 and node.output:
                    frontier.append(node.output[0])
                elif node.op_type == "Gather" and slot == 1 and node.input[0] in tables:
                    dims = tables[node.input[0]]
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                    if -len(dims) <= axis < len(dims) and dims[axis] > 0:
                        rows.append(int(dims[axis]))
        if rows:
            found[name] = min(rows)
    return found


def onnx_dim_names(path: Path, batching: bool) -> dict[str, list[str]]:
    """Each input's named dims (ONNX dim_param, "" where a dim has none), batch axis left out when `batching`:
    inputs whose dynamic dims share a name (input_ids and attention_mask share `sequence`) take one size together."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    skip = 1 if batching else 0
    return {
        v.name: [d.dim_param for d in v.type.tensor_type.shape.dim][skip:]
        for v in graph.input
        if v.name not in initializers
    }
