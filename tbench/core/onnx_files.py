"""The files an ONNX model keeps its weights in (external data): found in the model without loading the weights, and
copied wherever the model file goes."""

from __future__ import annotations

import shutil
from pathlib import Path

from tbench.core.errors import ConversionError


def onnx_external_files(path: Path) -> list[str]:
    """The files an ONNX model keeps its weights in (saved with external data, as every model over 2 GB is), relative
    to its folder: they travel with it wherever the model file goes. Empty for a folder or a file that is not ONNX."""
    if path.is_dir() or path.suffix != ".onnx":
        return []
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:
        return []
    graphs, tensors = [model.graph], []
    while graphs:  # the main graph and every subgraph (If, Loop, Scan bodies)
        graph = graphs.pop()
        tensors += list(graph.initializer)
        for node in graph.node:
            for attribute in node.attribute:
                tensors += [attribute.t] if attribute.HasField("t") else []
                tensors += list(attribute.tensors)
                graphs += ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs)
    return sorted(
        {
            entry.value
            for t in tensors
            if t.data_location == onnx.TensorProto.EXTERNAL
            for entry in t.external_data
            if entry.key == "location"
        }
    )


def copy_onnx_external_files(path: Path, target_dir: Path, copy=shutil.copy2) -> None:
    """Puts the files an ONNX model keeps its weights in beside its copy in `target_dir`, at the same relative places
    (`copy`: how, e.g. a hard link)."""
    for location in onnx_external_files(path):
        source = path.parent / location
        if not source.is_file():
            raise ConversionError(f"{path} keeps weights in {location}, which is not next to it ({source})")
        (target_dir / location).parent.mkdir(parents=True, exist_ok=True)
        copy(source, target_dir / location)
