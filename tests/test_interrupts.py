"""Ctrl-C in a terminal run: the first raises KeyboardInterrupt, but not in the middle of a block that holds it."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tbench.node.interrupts import cli_signal_handlers, interrupt_held


def test_a_ctrl_c_inside_a_held_block_is_raised_as_the_block_ends():
    finished = False
    with cli_signal_handlers(), pytest.raises(KeyboardInterrupt, match="SIGINT"):
        with interrupt_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # Python has run the handler by now: without the hold, it raised here
            finished = True
    assert finished


def test_a_ctrl_c_outside_a_held_block_is_raised_at_once():
    finished = False
    with cli_signal_handlers(), pytest.raises(KeyboardInterrupt, match="SIGINT"):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        finished = True
    assert not finished
