"""The client install and the node's stack: `pip install tbench` is the client (submit, results, compare, history,
upload, stack env, on Python 3.11 to 3.13); `run`, `search`, `capacity`, `doctor` and `stack up` also need the `node`
extra (pyproject.toml). A command that reaches for the node's stack in a client install is refused in one line naming
the extra (tbench.cli.main), never with a traceback."""

from __future__ import annotations

import importlib.util
import os
import sys

# the import names the `node` extra brings and the client does not: its packages and what they bring with them (onnx
# and protobuf are the client's too: `tbench submit --model-file x.onnx` reads the file on the laptop)
NODE_MODULES = (
    "torch",
    "tensorflow",
    "keras",  # tensorflow's
    "tf2onnx",
    "onnxruntime",
    "tritonclient",
    "pytriton",  # nvidia-pytriton: the embedded tritonserver
    "moto",  # moto[server]: the local stack's S3 endpoint
    "boto3",  # moto's
    "prefect_docker",
)
# console scripts of the node extra the CLI starts as processes (a FileNotFoundError, not an import) -> their package
NODE_EXECUTABLES = {"moto_server": "moto"}
NODE_STACK = "torch, tensorflow, onnxruntime, tritonclient, nvidia-pytriton, moto, ..."
INSTALL = "pip install 'tbench[node]' on Python 3.11 (in a checkout: ./scripts/setup.sh)"


def _absent(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is None
    except (ImportError, ValueError):  # a broken install of it: not the client's missing extra
        return False


def missing_node_module(err: BaseException) -> str | None:
    """What of the node's stack `err` says is missing here: a ModuleNotFoundError for one of NODE_MODULES (or a
    module of its package), or a FileNotFoundError for one of NODE_EXECUTABLES, whose package is indeed not installed;
    None for anything else (a node module missing from a full install is a broken install, not a client one)."""
    if isinstance(err, ModuleNotFoundError) and err.name:
        top = err.name.split(".")[0]
        if top in NODE_MODULES and _absent(top):
            return top
    if isinstance(err, FileNotFoundError) and err.filename:
        name = os.path.basename(str(err.filename))
        if name in NODE_EXECUTABLES and _absent(NODE_EXECUTABLES[name]):
            return name
    return None


def command_name(argv: list[str] | None = None) -> str:
    """`tbench run`, `tbench stack up`: the command as typed (its leading words, without options)."""
    words = []
    for arg in sys.argv[1:] if argv is None else argv:
        if arg.startswith("-") or len(words) == (2 if words[:1] == ["stack"] else 1):
            break
        words.append(arg)
    return " ".join(["tbench", *words])


def node_stack_line(missing: str, argv: list[str] | None = None) -> str:
    """The one line a client install prints for a command that needs the node's stack."""
    return f"error: {command_name(argv)} needs the node's stack ({NODE_STACK}; no {missing} here): {INSTALL}"
