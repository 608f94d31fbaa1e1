"""A search candidate written over the user's own config.pbtxt (`tbench search --repository DIR --model NAME`): only
the fields the search varies change (instances, max batch size, the dynamic batcher's preferred sizes and delay, the
runtime's threads per instance where the backend takes them); the version policy, parameters, inputs and outputs stay
as the user wrote them. Pure functions over Triton's own schema (model_config_pb2), written back with text_format.
"""

from __future__ import annotations

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tbench.search.space import Candidate

# the parameter each backend reads its threads per instance from (what serves the model, as its config names it)
THREAD_PARAMETERS = {
    "onnxruntime_onnx": "intra_op_thread_count",
    "onnxruntime": "intra_op_thread_count",
    "pytorch_libtorch": "INTRA_OP_THREAD_COUNT",
    "pytorch": "INTRA_OP_THREAD_COUNT",
}
RUNTIME_THREADS = "intra_op_threads"  # tbench's python-backend runtime (triton/python_backend/model.py)
RUNTIME_PARAMETER = "runtime"  # what marks a python model as tbench's runtime, not the user's own model.py


def thread_parameter(config: mc.ModelConfig) -> str | None:
    """The parameter that sets the runtime's threads per instance, or None where the backend takes none (a user's
    own python model, an ensemble, ...)."""
    if config.backend == "python" and RUNTIME_PARAMETER in config.parameters:
        return RUNTIME_THREADS
    return THREAD_PARAMETERS.get(config.platform) or THREAD_PARAMETERS.get(config.backend)


def _set_instances(config: mc.ModelConfig, count: int) -> None:
    """One instance group of `count`, of the kind (and devices) of the user's first group; KIND_AUTO where the user
    wrote none (Triton's own default)."""
    group = mc.ModelInstanceGroup()
    if config.instance_group:
        group.CopyFrom(config.instance_group[0])
    group.count = count
    del config.instance_group[:]
    config.instance_group.append(group)


def _set_batching(config: mc.ModelConfig, candidate: Candidate) -> None:
    """Max batch and the dynamic batcher's sizes and delay; the batcher's other fields (priorities, queue policy) as
    written. A model without a batch axis, or one under a sequence batcher, keeps its scheduling as written."""
    if config.max_batch_size == 0 or config.WhichOneof("scheduling_choice") == "sequence_batching":
        return
    config.max_batch_size = candidate.max_batch_size
    batcher = config.dynamic_batching  # set on first touch: the search serves with a dynamic batcher
    del batcher.preferred_batch_size[:]
    batcher.preferred_batch_size.extend(candidate.preferred_batch_sizes)
    batcher.max_queue_delay_microseconds = candidate.queue_delay_us


def edited_config(base: mc.ModelConfig, candidate: Candidate, threads: int) -> mc.ModelConfig:
    """`base` (the user's config as written) with `candidate`'s instances and batching and `threads` threads per
    instance where its backend takes them; `base` itself is not changed."""
    config = mc.ModelConfig()
    config.CopyFrom(base)
    _set_instances(config, candidate.instances)
    _set_batching(config, candidate)
    if key := thread_parameter(config):
        config.parameters[key].string_value = str(threads)
    return config


def candidate_of(config: mc.ModelConfig) -> Candidate:
    """The user's config as the search's coordinates (its instances summed over its groups, its batcher's sizes and
    delay): where a search starts, and how the user's own row is described."""
    batcher = config.dynamic_batching
    batch = config.max_batch_size
    return Candidate(
        instances=sum(max(g.count, 1) for g in config.instance_group) or 1,
        max_batch_size=batch,
        preferred_batch_sizes=tuple(sorted(s for s in batcher.preferred_batch_size if 1 <= s <= batch)),
        queue_delay_us=int(batcher.max_queue_delay_microseconds) if batch else 0,
    )


def to_text(config: mc.ModelConfig) -> str:
    """A config.pbtxt as Triton reads it."""
    return text_format.MessageToString(config)
