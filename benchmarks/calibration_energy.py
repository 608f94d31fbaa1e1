"""Energy per inference against a known truth: a simulated point's GPU power trace, Triton's energy counter refreshed
once per metrics interval, the monitor's readings, and the project's own energy code (tbench.triton.monitor) -> J per
inference, compared with the truth (the energy over the measured windows / the inferences served in them).

A point: the monitor starts; perf_analyzer starts up (0.5-1.5 s, idle power, no requests); a steady load runs for
3-6 windows of 1.5-3 s (power ramps to its load level in 0.3 s, then wanders by ~3%; requests arrive at a steady
rate), the last 3 of them the measured windows; perf_analyzer winds down (0.2-0.5 s idle); the monitor stops. Triton
polls the power at a random phase once per interval and its counter is the energy up to the last poll. `before`: the
counter's difference from start to stop / the requests over the same span (dd6368f, with Triton's default 2,000 ms
interval); `after`: `energy_under_load` on readings every 100 ms with --metrics-interval-ms=100.

Usage: .venv/bin/python benchmarks/calibration_energy.py   (prints the JSON; writes nothing)
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from tbench.triton.monitor import METRICS_INTERVAL_MS, energy_under_load

DT = 0.002  # s, the simulated power trace's step
DEFAULT_INTERVAL_S = 2.0  # Triton's default --metrics-interval-ms
TRIALS = 1000  # at scale 1
STABLE_WINDOWS = 3


def point(rng: np.random.Generator) -> dict:
    """One simulated point: its time axis, power, cumulative requests, and where the measured windows are."""
    startup, wind_down = rng.uniform(0.5, 1.5), rng.uniform(0.2, 0.5)
    window_s, windows = rng.uniform(1.5, 3.0), int(rng.integers(3, 7))
    idle_w, load_w, rate = rng.uniform(50, 80), rng.uniform(150, 350), rng.uniform(100, 2000)
    load_start, load_end = startup, startup + windows * window_s
    t = np.arange(0, load_end + wind_down, DT)
    loaded = (t >= load_start) & (t < load_end)
    ramp = np.clip((t - load_start) / 0.3, 0, 1)
    wander = 1 + 0.03 * np.cumsum(rng.standard_normal(t.size)) * np.sqrt(DT / (windows * window_s))
    power = np.where(loaded, idle_w + (load_w - idle_w) * ramp * wander, idle_w)
    power *= 1 + 0.02 * rng.standard_normal(t.size)  # sensor noise
    arrivals = np.where(loaded, rng.poisson(rate * DT, t.size), 0)
    return {
        "t": t,
        "energy": np.concatenate([[0.0], np.cumsum(power[:-1] * DT)]),  # J at the start of each step
        "requests": np.cumsum(arrivals) - arrivals,  # served before each step
        "windows": (load_end - STABLE_WINDOWS * window_s, load_end),
    }


def at(p: dict, key: str, times: np.ndarray) -> np.ndarray:
    return p[key][np.clip(np.searchsorted(p["t"], times), 0, p["t"].size - 1)]


def counter(p: dict, times: np.ndarray, interval_s: float, phase: float) -> np.ndarray:
    """Triton's energy counter as read at `times`: the energy up to its last poll."""
    polls = phase + np.floor((times - phase) / interval_s) * interval_s
    return at(p, "energy", np.maximum(polls, 0.0))


def truth(p: dict) -> float:
    a, b = p["windows"]
    ends = np.array([a, b])
    return float(np.diff(at(p, "energy", ends))[0] / np.diff(at(p, "requests", ends))[0])


def before(p: dict, rng) -> float:
    ends = np.array([0.0, p["t"][-1]])
    joules = counter(p, ends, DEFAULT_INTERVAL_S, rng.uniform(0, DEFAULT_INTERVAL_S))
    return float(np.diff(joules)[0] / np.diff(at(p, "requests", ends))[0])


def after(p: dict, rng) -> tuple[float, float] | None:
    interval = METRICS_INTERVAL_MS / 1000
    reads = np.arange(rng.uniform(0, interval), p["t"][-1], interval)  # the monitor's readings, every interval
    load = energy_under_load(
        reads, counter(p, reads, interval, rng.uniform(0, interval)), at(p, "requests", reads), interval
    )
    return None if load is None else (load.joules_per_request, load.uncertainty_j / load.joules)


def summary(errors: np.ndarray) -> dict:
    return {
        "within_5pct": round(float(np.mean(np.abs(errors) <= 0.05)), 4),
        "median_error_pct": round(float(100 * np.median(errors)), 2),
        "median_abs_error_pct": round(float(100 * np.median(np.abs(errors))), 2),
        "p95_abs_error_pct": round(float(100 * np.quantile(np.abs(errors), 0.95)), 2),
    }


def calibrate(seed: int = 0, scale: float = 1.0) -> dict:
    started = time.monotonic()
    rng = np.random.default_rng(seed)
    trials = max(1, round(TRIALS * scale))
    old, new, stated = [], [], []
    for _ in range(trials):
        p = point(rng)
        true = truth(p)
        old.append(before(p, rng) / true - 1)
        got = after(p, rng)
        new.append(np.nan if got is None else got[0] / true - 1)
        stated.append(np.nan if got is None else got[1])
    new, stated = np.array(new), np.array(stated)
    return {
        "rules": {
            "energy": {
                **summary(np.nan_to_num(new, nan=1.0)),
                "within_stated_uncertainty_x2": round(float(np.mean(np.abs(new) <= 2 * stated)), 4),
                "median_stated_uncertainty_pct": round(float(100 * np.nanmedian(stated)), 2),
                "before": summary(np.array(old)),
            }
        },
        "conditions": {
            "energy": {
                "points": trials,
                "startup_s": [0.5, 1.5],
                "wind_down_s": [0.2, 0.5],
                "window_s": [1.5, 3.0],
                "windows_per_point": [3, 6],
                "measured_windows": STABLE_WINDOWS,
                "idle_w": [50, 80],
                "load_w": [150, 350],
                "power_ramp_s": 0.3,
                "power_wander": "3% random walk over the load, 2% sensor noise",
                "request_rate_per_s": [100, 2000],
                "before_interval_ms": DEFAULT_INTERVAL_S * 1000,
                "seed": seed,
                "seconds": round(time.monotonic() - started, 1),
            }
        },
        "parameters": {"energy": {"METRICS_INTERVAL_MS": METRICS_INTERVAL_MS}},
    }


if __name__ == "__main__":
    scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    print(json.dumps(calibrate(scale=scale), indent=2))
