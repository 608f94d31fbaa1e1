"""A simulated response surface anchored on the reference guides' published results, as a search Evaluator.

For one (model, GPU, format, precision) of `tbench/data/published_results.csv` it predicts the throughput and p99 of
any configuration (instances n, max batch B, preferred sizes, queue delay d) under a closed loop of C clients sending
requests of s samples (C: by default the largest published online concurrency; s: the online batch size), so that
searches can be compared on surfaces that do not depend on this machine.

The model and its assumptions:

- **Batch time.** t1(b), the time one instance takes for a batch of b samples, is the published offline latency
  (concurrency 1) at batch b, interpolated linearly in log(batch)-log(latency); beyond the largest published batch it
  is extrapolated with the last segment's slope, at least 1 (no further gain from batching).
- **Server vs client share.** The offline latency also holds the client's and the network's part. A fraction k of it
  is spent in the server (t_s(b) = k t1(b)); the rest, o = (1 - k) t1(s) per request, is spent outside the server
  and overlaps between clients.
- **Instances share the GPU.** With m instances executing at once each batch takes m^(1 - eta) times longer, so
  n instances give at most n^eta times one instance's throughput (eta = 1: perfect scaling, eta = 0: none).
- **Dynamic batcher (Triton's rules).** A free instance takes the largest preferred size (max batch when none is
  given) that the waiting requests fill; when they fill none it holds the batch up to the queue delay for more
  requests, then sends what it has. In steady state (a mean-value, fluid approximation), with N requests at the
  server, an instance finds N - (n - 1) b waiting when the other instances hold batches of b; under light load each
  request starts a batch that fills at the arrival rate for up to d. Throughput is the smaller of what the clients
  send and what the instances serve, solved as a fixed point of the closed loop (C = X (o + R)); the mean latency is
  C / X.
- **Fitted per surface, from the published online rows** (at the published config: the CSV's instances and max
  batch, the guide's preferred sizes and queue delay): k and eta by least squares of log throughput over all online
  rows (eta is not identifiable when the guide ran one instance: 0.5 is assumed there). The fit is in-sample: the
  test checks it reproduces those rows within 30%.
- **p99.** p99 = r(b) x (mean latency - mean fill wait) + the full fill wait (the first request of a held batch waits
  all of it), where the dispersion r(b) = r0 + r1 ln(b) is fitted (Theil-Sen) to the online rows' p99/avg against
  the model's batch size at each row: bigger batches widen the tail, as the published rows show.
- **Noise.** Deterministic multiplicative noise (lognormal, 2% by default) seeded by the surface, the seed and the
  candidate, so a search sees the same value for the same candidate and searches are not trivially exact.
- A candidate whose max batch is below the request size, or whose format the surface does not have, is an error
  observation (Triton would refuse it).
"""

from __future__ import annotations

import bisect
import hashlib
import math
import re
from dataclasses import dataclass, field
from functools import cache, lru_cache

import numpy as np
import pandas as pd

from tbench.results.published import load_published
from tbench.search.strategies import Candidate, Observation, SearchSpace

# The guides' dynamic batching (the adapters' gpu-profile defaults): the CSV has instances and max batch, not these.
PUBLISHED_BATCHING = {
    "resnet50": ([64, 128], 1000),
    "fastpitch": ([4, 8], 1),
    "nnunet": ([2, 4], 1),
    "widedeep": ([131072], 1000),
}
DEFAULT_ETA = 0.5  # instance scaling exponent where the published rows cannot tell (one instance)
K_GRID = (0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 1.0)  # the server's share of a batch's offline latency
G_GRID = (
    0.0,
    0.25,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.5,
    6.0,
)  # online per-request overhead, in single-request offline latencies
ETA_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)


def variant_label(model_format: str, precision: str) -> str:
    """'TensorFlow SavedModel', 'FP16' -> 'tensorflow-savedmodel:fp16'."""
    return re.sub(r"[^a-z0-9]+", "-", model_format.lower()).strip("-") + ":" + precision.lower()


@lru_cache(maxsize=1)
def published() -> pd.DataFrame:
    return load_published()


def published_surfaces() -> list[tuple[str, str, str]]:
    """(model, gpu, variant) of every published surface with both offline and online rows."""
    table = published()
    out = []
    for (model, gpu, fmt, prec), rows in table.groupby(["model", "gpu", "model_format", "precision"], sort=True):
        if model in PUBLISHED_BATCHING and {"offline", "online"} <= set(rows["scenario"]):
            out.append((model, gpu, variant_label(fmt, prec)))
    return out


@dataclass
class SteadyState:
    throughput: float  # inferences/s
    avg_ms: float
    p99_ms: float
    batch: float  # requests per batch
    wait_ms: float  # fill wait of a held batch


@dataclass
class Surface:
    """One published (model, gpu, format, precision), calibrated."""

    model: str
    gpu: str
    variant: str
    batches: np.ndarray  # offline batch sizes (samples)
    latency_ms: np.ndarray  # offline avg latency at those batches
    request_samples: int  # samples per online request
    published_instances: int
    published_max_batch: int
    published_preferred: list[int]
    published_delay_us: int
    online: pd.DataFrame  # concurrency, throughput_infer_per_s, avg_ms, p99_ms
    k: float = 1.0
    g: float = 0.0
    eta: float = DEFAULT_ETA
    r0: float = 1.2
    r1: float = 0.0
    fit_error: float = field(default=math.nan)  # rms log error of throughput over the online rows

    # -- the model
    def __post_init__(self):
        self._lb = [math.log(b) for b in self.batches]
        self._lt = [math.log(t) for t in self.latency_ms]

    def batch_ms(self, samples: float) -> float:
        """t1: one instance's time for a batch of `samples` at concurrency 1, from the offline rows (log-log)."""
        lb, lt = self._lb, self._lt
        x = math.log(max(samples, 1e-9))
        if x <= lb[0] or len(lb) == 1:
            return math.exp(lt[0]) if x <= lb[0] else math.exp(lt[0] + (x - lb[0]))  # one row: time grows with samples
        if x >= lb[-1]:
            slope = max(1.0, (lt[-1] - lt[-2]) / (lb[-1] - lb[-2]))
            return math.exp(lt[-1] + slope * (x - lb[-1]))
        i = bisect.bisect_right(lb, x) - 1
        return math.exp(lt[i] + (x - lb[i]) * (lt[i + 1] - lt[i]) / (lb[i + 1] - lb[i]))

    def overhead_ms(self, g: float | None = None) -> float:
        """Per request, outside the server (client and network), in the online scenario: g x t1(one request)."""
        return (self.g if g is None else g) * self.batch_ms(self.request_samples)

    def dispersion(self, batch: float) -> float:
        return max(1.0, self.r0 + self.r1 * math.log(max(batch, 1.0)))

    def steady_state(
        self,
        instances: int,
        max_batch: int,
        preferred: tuple[int, ...] | list[int],
        delay_us: int,
        concurrency: int,
        k: float | None = None,
        g: float | None = None,
        eta: float | None = None,
    ) -> SteadyState | None:
        """The closed loop's fixed point; None when the config cannot serve a request (max batch < request size)."""
        k = self.k if k is None else k
        eta = self.eta if eta is None else eta
        s = self.request_samples
        cap = max_batch // s  # requests per batch
        if cap < 1:
            return None
        prefs = sorted({p // s for p in preferred if p // s >= 1 and p <= max_batch}) or [cap]
        pmin = prefs[0]
        n, C, d = instances, float(concurrency), delay_us / 1000.0
        o = self.overhead_ms(g)  # per request, outside the server
        memo: dict[tuple[float, float], float] = {}

        def t_server(b: float, m: float) -> float:
            key = (b, m)
            if key not in memo:
                memo[key] = k * self.batch_ms(b * s) * max(1.0, m) ** (1.0 - eta)
            return memo[key]

        def take(a: float, x: float) -> tuple[float, float]:
            """Batch size and fill wait when an instance frees with `a` requests waiting, arrivals at x per ms."""
            a = max(a, 1.0)
            formable = [p for p in prefs if p <= min(a, cap)]
            if formable:
                return float(formable[-1]), 0.0
            if d <= 0 or x <= 0:
                return min(a, float(cap)), 0.0
            w = min(d, (pmin - a) / x)
            return min(float(pmin), a + x * w, float(cap)), w

        def served(x: float) -> tuple[float, float, float]:
            """Server throughput (requests/ms) when the clients send x per ms; with the batch and its fill wait."""
            ns = max(C - x * o, 1e-9)  # requests at the server (Little)
            # light load: each request finds a free instance and starts (or joins) a batch
            b1, w1 = take(1.0, x)
            t1 = t_server(b1, 1.0)
            busy = min(float(n), ns * t1 / (w1 / 2 + t1) / b1)
            light = ns / (w1 / 2 + t_server(b1, round(max(busy, 1.0), 2)))
            # saturation: all n instances busy, each finds its share of the waiting requests
            b2, w2 = take(ns / n, x)
            heavy = n * b2 / (w2 + t_server(b2, float(n)))
            return (light, b1, w1) if light <= heavy else (heavy, b2, w2)

        lo, hi = 0.0, (C / o if o > 0 else served(0.0)[0] * 1.0001)
        for _ in range(45):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if served(mid)[0] > mid else (lo, mid)
        x = max(lo, 1e-12)
        _, b, w = served(x)
        avg = C / x
        mean_wait = min(w / 2, avg)
        p99 = self.dispersion(b) * (avg - mean_wait) + w
        return SteadyState(throughput=x * 1000.0 * s, avg_ms=avg, p99_ms=p99, batch=b, wait_ms=w)

    def published_state(
        self, concurrency: int, k: float | None = None, g: float | None = None, eta: float | None = None
    ) -> SteadyState:
        return self.steady_state(
            self.published_instances,
            self.published_max_batch,
            self.published_preferred,
            self.published_delay_us,
            concurrency,
            k,
            g,
            eta,
        )

    # -- calibration
    def _error(self, params: tuple[float, float, float]) -> float:
        conc = self.online["concurrency"].to_numpy(int)
        want = np.log(self.online["throughput_infer_per_s"].to_numpy(float))
        got = np.log([self.published_state(c, *params).throughput for c in conc])
        return float(np.mean((got - want) ** 2))

    def fit(self) -> Surface:
        """k, g (and eta where the guide ran several instances): a coarse grid, then a pattern search from its best;
        then the dispersion r(b)."""
        etas = ETA_GRID if self.published_instances > 1 else [DEFAULT_ETA]
        err, params = min((self._error((k, g, e)), (k, g, e)) for k in K_GRID for g in G_GRID for e in etas)
        steps = [0.05, 0.1, 0.1 if self.published_instances > 1 else 0.0]
        bounds = [(0.02, 1.0), (0.0, G_GRID[-1]), (0.0, 1.0)]
        for _ in range(4):  # halve the steps each round
            improved = True
            while improved:
                improved = False
                for i, step in enumerate(steps):
                    for sign in (1, -1):
                        trial = list(params)
                        trial[i] = min(max(trial[i] + sign * step, bounds[i][0]), bounds[i][1])
                        if tuple(trial) != params:
                            e = self._error(tuple(trial))
                            if e < err:
                                err, params, improved = e, tuple(trial), True
            steps = [s / 2 for s in steps]
        self.fit_error = math.sqrt(err)
        self.k, self.g, self.eta = (float(v) for v in params)
        conc = self.online["concurrency"].to_numpy(int)
        batches = np.array([self.published_state(c).batch for c in conc])
        ratio = (self.online["p99_ms"] / self.online["avg_ms"]).to_numpy(float)
        self.r0, self.r1 = theil_sen(np.log(np.maximum(batches, 1.0)), ratio)
        if self.r1 <= 0.0:
            self.r0, self.r1 = float(np.median(ratio)), 0.0
        return self


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Intercept and slope, robust to the odd published outlier: the median of pairwise slopes."""
    slopes = [
        (y[j] - y[i]) / (x[j] - x[i]) for i in range(len(x)) for j in range(i + 1, len(x)) if abs(x[j] - x[i]) > 1e-9
    ]
    slope = float(np.median(slopes)) if slopes else 0.0
    return float(np.median(y - slope * x)), slope


@cache
def calibrated(model: str, gpu: str, variant: str) -> Surface:
    table = published()
    rows = table[(table["model"] == model) & (table["gpu"] == gpu)]
    rows = rows[[variant_label(f, p) == variant for f, p in zip(rows["model_format"], rows["precision"])]]
    offline = rows[rows["scenario"] == "offline"].sort_values("batch_size")
    online = rows[rows["scenario"] == "online"].sort_values("concurrency")
    if offline.empty or online.empty:
        raise ValueError(f"no published offline and online rows for {model} on {gpu} ({variant})")
    offline = offline.groupby("batch_size", as_index=False)["avg_ms"].mean()
    preferred, delay = PUBLISHED_BATCHING[model]
    surface = Surface(
        model=model,
        gpu=gpu,
        variant=variant,
        batches=offline["batch_size"].to_numpy(float),
        latency_ms=offline["avg_ms"].to_numpy(float),
        request_samples=int(online["batch_size"].iloc[0]),
        published_instances=int(online["model_instances"].iloc[0]),
        published_max_batch=int(online["max_batch_size"].iloc[0]),
        published_preferred=preferred,
        published_delay_us=delay,
        online=online[["concurrency", "throughput_infer_per_s", "avg_ms", "p99_ms"]].reset_index(drop=True),
    )
    return surface.fit()


class SimulatedSurface:
    """An Evaluator over the published surfaces of one (model, gpu): one per variant (format:precision)."""

    def __init__(
        self,
        model: str,
        gpu: str,
        variants: list[str] | None = None,
        concurrency: int | None = None,
        noise: float = 0.02,
        seed: int = 0,
    ):
        available = [v for m, g, v in published_surfaces() if m == model and g == gpu]
        if not available:
            raise ValueError(f"no published surface for {model} on {gpu}")
        unknown = [v for v in variants or [] if v not in available]
        if unknown:
            raise ValueError(f"{model} on {gpu} has no published variant {unknown[0]!r}; it has {', '.join(available)}")
        self.model, self.gpu, self.noise, self.seed = model, gpu, noise, seed
        self.surfaces = {v: calibrated(model, gpu, v) for v in (variants or available)}
        self.default_variant = next(iter(self.surfaces))
        first = self.surfaces[self.default_variant]
        self.concurrency = concurrency or int(first.online["concurrency"].max())
        self.evaluations = 0

    def surface(self, candidate: Candidate) -> Surface | None:
        return self.surfaces.get(candidate.format or self.default_variant)

    def _noise(self, candidate: Candidate) -> tuple[float, float]:
        digest = hashlib.sha256(f"{self.model}|{self.gpu}|{self.seed}|{candidate.key}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        return tuple(float(v) for v in np.exp(rng.normal(0.0, self.noise, 2)))

    def truth(self, candidate: Candidate) -> SteadyState | None:
        """The noiseless model."""
        surface = self.surface(candidate)
        if surface is None:
            return None
        return surface.steady_state(
            candidate.instances,
            candidate.max_batch_size,
            candidate.preferred_batch_sizes,
            candidate.queue_delay_us,
            self.concurrency,
        )

    def evaluate(self, candidate: Candidate) -> Observation:
        self.evaluations += 1
        if self.surface(candidate) is None:
            return Observation(candidate=candidate, status="error", error=f"no published variant {candidate.format!r}")
        state = self.truth(candidate)
        if state is None:
            return Observation(
                candidate=candidate,
                status="error",
                error=f"max batch {candidate.max_batch_size} is below the request size "
                f"{self.surface(candidate).request_samples}",
            )
        nx, np99 = self._noise(candidate)
        return Observation(
            candidate=candidate,
            throughput=state.throughput * nx,
            p99_ms=state.p99_ms * np99,
            avg_ms=state.avg_ms * np99,
            status="ok",
        )

    def default_candidate(self) -> Candidate:
        """The guide's configuration: where a smart search starts."""
        s = self.surfaces[self.default_variant]
        return Candidate(
            instances=s.published_instances,
            max_batch_size=s.published_max_batch,
            preferred_batch_sizes=tuple(s.published_preferred),
            queue_delay_us=s.published_delay_us,
            format=self.default_variant if len(self.surfaces) > 1 else "",
        )

    def space(self, shape: str = "large") -> SearchSpace:
        """A grid around the guide's config. 'small' (60 candidates, the real CPU grid's shape): instances {1, 2} x
        the 5 largest max batches x preferred {none, max} x delay {0, 500, 2000} us; 'large': instances {1..4} x
        every power-of-two max batch from one request to the largest published batch x preferred {none, max, half}
        x delay {0, 100, 500, 2000} us, and every variant when the surface has several."""
        s = self.surfaces[self.default_variant]
        top = max(int(s.batches.max()), s.published_max_batch)
        batches = []
        b = s.request_samples
        while b <= top:
            batches.append(b)
            b *= 2
        formats = list(self.surfaces) if len(self.surfaces) > 1 else [""]
        if shape == "small":
            while len(batches) < 5:
                batches.append(batches[-1] * 2)
            return SearchSpace(
                instances=[1, 2],
                max_batch_sizes=batches[-5:],
                preferred=["none", "max"],
                queue_delays_us=[0, 500, 2000],
                formats=formats,
            )
        return SearchSpace(
            instances=[1, 2, 3, 4],
            max_batch_sizes=batches,
            preferred=["none", "max", "half"],
            queue_delays_us=[0, 100, 500, 2000],
            formats=formats,
        )
