"""What a user asks a run to do: the benchmark request (its options, defaults and validation) and the TensorRT profiles
that follow from it."""
