"""This machine: processes, shared memory, containers, tools, GPUs, ports, the device lock."""
