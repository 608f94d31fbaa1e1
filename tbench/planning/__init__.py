"""How a run will run on this node: what the node can do (doctor), the run plan made once from the request and the
hardware, and the preflight checks of the options against this machine."""
