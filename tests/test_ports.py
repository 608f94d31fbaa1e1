"""Ports picked for servers: outside the ephemeral range, and never one another process of this host holds."""

import json
import subprocess
import sys

from tbench.node import ports


def test_a_picked_port_is_outside_the_ephemeral_range_and_free():
    low, high = ports.ephemeral_range()
    picked = [ports.free_port() for _ in range(200)]
    try:
        assert all(ports.LOWEST <= p <= 65535 and not low <= p <= high for p in picked)
        assert len(set(picked)) == len(picked)  # a port this process holds is not picked again
        assert not any(ports.port_in_use(p) for p in picked)
        assert all((ports.RESERVATIONS / str(p)).exists() for p in picked)
    finally:
        for p in picked:
            ports.release(p)
    assert not any((ports.RESERVATIONS / str(p)).exists() for p in picked)  # released: nothing left behind


def test_a_port_another_process_holds_is_never_picked():
    """Without the reservation, 3,000 picks among ~27,000 ports would hit one of 100 held ports about 11 times."""
    held = [ports.free_port() for _ in range(100)]
    try:
        script = (
            "import json, sys\nfrom tbench.node import ports\nheld = set(json.loads(sys.argv[1]))\nclashes = 0\n"
            "for _ in range(3000):\n    p = ports.free_port()\n    clashes += p in held\n    ports.release(p)\n"
            "print(clashes)"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, json.dumps(held)], capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == "0"
    finally:
        for p in held:
            ports.release(p)
