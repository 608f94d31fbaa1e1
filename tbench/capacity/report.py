"""The capacity answer of one pool (from a finished configuration search at open-loop rates) and the capacity report
of one or many pools: ranked by cost at the SLO, p99 against offered rate with the SLO line, the chosen configuration,
and what each answer rests on (every rate point, its verdict and the requests behind it)."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, Field

from tbench.capacity.costs import Plan, load_prices, plan, price_for
from tbench.capacity.evaluate import load_rate_search
from tbench.capacity.rate_search import SustainableRate
from tbench.capacity.request import CapacityRequest
from tbench.core.storage import url_to_fs
from tbench.results.html_report import write_html_report
from tbench.search.strategies import SearchResult

CAPACITY_JSON = "capacity.json"
CAPACITY_MD = "capacity.md"


class AnswerStatus(str, Enum):  # noqa: UP042 - as tbench.core.enums: str() and format() stay the value's
    OK = "ok"  # a configuration met the SLO: its sustainable rate, instances and cost
    NO_RATE = "no_rate"  # every configuration's search failed down to its lowest rate: none can meet the SLO
    UNDETERMINED = "undetermined"  # none was shown to meet it before a budget stopped a search: more time would decide
    FAILED = "failed"  # the pool's run did not end with an answer

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


class PoolAnswer(BaseModel):
    """One pool's answer: the best configuration, its sustainable rate, what serving the traffic takes and costs."""

    pool: str | None
    hardware: str = Field("", description="The GPU (or CPU) it was measured on.")
    model: str
    status: AnswerStatus = Field(
        AnswerStatus.OK,
        description="ok | no_rate (every rate failed the SLO) | undetermined (a budget stopped the searches before "
        "they decided) | failed (the run did not end)",
    )
    reason: str = ""
    configuration: dict | None = None
    steps: dict[str, dict] = Field(
        {},
        description="A pipeline's (an ensemble's): each step's chosen configuration (`yours`: no candidate of the step "
        "met the SLO, so the user's config as written); `configuration` is its last.",
    )
    rate: SustainableRate | None = None
    plan: Plan | None = None
    price: dict | None = None
    candidates: list[dict] = Field([], description="Every configuration tried: its key, status and sustainable rate.")
    run_url: str = ""


def pool_answer(
    result: SearchResult,
    work_dir: Path,
    cap: CapacityRequest,
    *,
    model: str,
    pool: str | None,
    hardware: str,
    batch_size: int = 1,
    run_url: str = "",
) -> PoolAnswer:
    """The answer of a finished (or partial) capacity search on this machine."""
    candidates = []
    for o in result.observations:
        found = load_rate_search(work_dir, o.candidate)
        candidates.append(
            {
                "key": o.candidate.key,
                "status": o.status,
                "error": o.error,
                "rate_rps": found.rate if found else None,
                "points": len(found.points) if found else 0,
            }
        )
    answer = PoolAnswer(pool=pool, hardware=hardware, model=model, candidates=candidates, run_url=run_url)
    best = result.best
    if best is None:
        return answer.model_copy(update=_without_rate(result, work_dir))
    found = load_rate_search(work_dir, best.candidate)
    price = price_for(load_prices(cap.prices), pool) if pool else None
    at = found.at_rate
    costs = plan(
        found.sustained_rps,
        cap.traffic_rps,
        cap.headroom,
        batch_size,
        usd_per_hour=float(price["usd_per_hour"]) if price else None,
        power_w=at.power_w if at else None,
        joules_per_inference=at.joules_per_inference if at else None,
    )
    reason = "" if price else f"no price for pool {pool!r} in the price table"
    return answer.model_copy(
        update={"configuration": best.candidate.model_dump(mode="json"), "rate": found, "plan": costs, "price": price}
        | ({"reason": reason} if reason else {})
    )


def _without_rate(result: SearchResult, work_dir: Path) -> dict:
    """No configuration passed: `no_rate` where every rate search ran down to its lowest rate failing, `undetermined`
    where a budget stopped one before it decided (the time budget spent is not every rate failing)."""
    searches = [s for s in (load_rate_search(work_dir, o.candidate) for o in result.observations) if s]
    if not searches:
        errors = [o.error for o in result.observations if o.error]
        first = f" (the first: {errors[0]})" if errors else ""
        return {"status": AnswerStatus.UNDETERMINED, "reason": f"no configuration's rate search ran{first}"}
    cut = [s for s in searches if not s.ruled_out]
    if not cut:
        why = f" (the first configuration's search: {searches[0].stopped})" if searches[0].stopped else ""
        return {"status": AnswerStatus.NO_RATE, "reason": f"every rate failed the SLO{why}", "rate": searches[0]}
    why = f": {cut[0].stopped}" if cut[0].stopped else ""
    return {
        "status": AnswerStatus.UNDETERMINED,
        "reason": f"no configuration was shown to meet the SLO before {len(cut)} of {len(searches)} rate searches "
        f"stopped undecided (the first{why}); a larger budget (--max-minutes, --max-points) would decide",
        "rate": cut[0],
    }


def ranked(answers: list[PoolAnswer]) -> list[PoolAnswer]:
    """Cheapest per million inferences first; answers without a cost (no price, no rate, failed) after them."""

    def key(a: PoolAnswer):
        cost = a.plan.usd_per_million if a.plan else None
        return (cost is None, cost if cost is not None else 0.0, a.pool or "")

    return sorted(answers, key=key)


def _fmt(value, spec: str = ".3g", none: str = "–") -> str:
    return none if value is None else format(value, spec)


def plot_latency_vs_rate(answers: list[PoolAnswer], cap: CapacityRequest, path: Path) -> Path:
    """The SLO's percentile against the offered rate, per pool (its chosen configuration's points); failed points
    hollow, the SLO as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for a in answers:
        if not a.rate:
            continue
        points = sorted((p for p in a.rate.points if p.latency_ms is not None), key=lambda p: p.rate)
        if not points:
            continue
        line = ax.plot([p.rate for p in points], [p.latency_ms for p in points], "-", alpha=0.6)[0]
        ok = [p for p in points if p.passed]
        bad = [p for p in points if not p.passed]
        ax.plot([p.rate for p in ok], [p.latency_ms for p in ok], "o", color=line.get_color(), label=a.pool or "here")
        ax.plot([p.rate for p in bad], [p.latency_ms for p in bad], "o", mfc="none", color=line.get_color())
    ax.axhline(cap.slo_ms, color="#d62728", ls="--", lw=1, label=f"SLO {cap.slo_ms:g} ms")
    ax.set_xlabel("offered rate (requests/s, Poisson)")
    ax.set_ylabel(f"p{cap.rule.percentile} latency (ms)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Latency against offered rate (hollow: the point failed)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def capacity_markdown(answers: list[PoolAnswer], cap: CapacityRequest, model: str, plot: str | None = None) -> str:
    answers = ranked(answers)
    rule = cap.rule
    lines = [
        f"# Capacity plan: {model}",
        "",
        f"Serve **{cap.traffic_rps:g} requests/s** with **p{rule.percentile} ≤ {cap.slo_ms:g} ms**, "
        f"{100 * cap.headroom:g}% headroom. Pools ranked by cost per million inferences at that traffic.",
        "",
        *_trace_lines(answers, cap),
        "| rank | pool | hardware | configuration | sustainable rate (req/s) | instances | $/h | $/million | "
        f"J/inference | p{rule.percentile} at rate (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, a in enumerate(answers, 1):
        at = a.rate.at_rate if a.rate else None
        p = a.plan
        config = _configs_label(a) if a.configuration else f"**{a.status}**: {a.reason}"
        lines.append(
            f"| {i} | {a.pool or 'this machine'} | {a.hardware} | {config} | {_sustained(a.rate)} "
            f"| {_fmt(p.instances if p else None, 'd')} | {_fmt(p.cost_per_hour if p else None, '.2f')} "
            f"| {_fmt(p.usd_per_million if p else None, '.3g')} | {_fmt(p.joules_per_inference if p else None)} "
            f"| {_fmt(at.latency_ms if at else None)} |"
        )
    lines += ["", "How it was measured:", "", f"- {rule.describe()}."]
    arrivals = (
        "the trace's arrivals" if cap.trace else "bursty (gamma) arrivals" if cap.burstiness else "Poisson arrivals"
    )
    lines += [
        f"- Each rate is one perf_analyzer run with {arrivals}, sent asynchronously. A rate passes when the "
        f"p{rule.percentile} is within the SLO, the percentile rests on enough requests and the server kept up with "
        "the offered rate: it served within 3/√n of it (at least 2%), its latency did not keep rising over the "
        "windows, and at most 1% of the requests were sent late; a point whose windows cannot tell (undetermined) "
        "does not pass. Late sends while the server served all it was offered are the load generator's limit: the "
        "rate is then a lower bound (≥).",
        "- A rate is measured again until its runs, pooled, decide: it passes when the share of requests over the SLO "
        f"is below p{rule.percentile}'s tail by enough standard errors (the variance widened where slow requests come "
        "in clusters, or where the runs disagree), fails when above it, and after "
        f"{cap.repeats} runs still undecided it does not pass. A rate far from the answer is decided by one run.",
        "- The sustainable rate is what the highest passing rate served (never more than was offered), measured at "
        "least three times (a confirmation); configurations are ranked on it.",
        f"- The sustainable rate is the highest passing rate of a bracketing search (double or halve, then bisect) "
        f"that stops when the passing and failing rates are within {100 * cap.tolerance:g}%, or after "
        f"{cap.max_points} measurements"
        + (f" or {cap.max_minutes:g} min per configuration (--max-minutes)." if cap.max_minutes else "."),
        "- Instances = ⌈traffic × (1 + headroom) / sustainable rate⌉; $/million = instances × $/h / (traffic × 3600) "
        "× 10⁶; energy per inference: the serving GPUs' energy counter over the sustainable rate's point / the "
        "inferences served in it (none on a CPU).",
        "",
    ]
    if plot:
        lines += [f"![latency against offered rate]({plot})", ""]
    for a in answers:
        lines += _pool_section(a, cap)
    lines += _prices_section(answers)
    return "\n".join(lines)


def _trace_lines(answers: list[PoolAnswer], cap: CapacityRequest) -> list[str]:
    """A plan on a trace: the trace, and each pool's answer as the speed-up of it that held; on bursty arrivals, their
    burstiness."""
    if cap.burstiness is not None:
        return [
            f"Bursty arrivals: at each rate, gamma intervals whose coefficient of variation is {cap.burstiness:g} "
            "(1 is Poisson; above 1, bursts and lulls), through perf_analyzer's custom intervals. The sustainable "
            "rates are the mean rates of such traffic.",
            "",
        ]
    mean = cap.trace_rate()
    if mean is None:
        return []
    speeds = [
        f"{a.pool or 'this machine'} {a.rate.sustained_rps / mean:.3g}x"
        for a in answers
        if a.rate and a.rate.sustained_rps
    ]
    return [
        f"Traffic from the trace {cap.trace} (mean {mean:.4g} requests/s at its own speed): each rate replays it "
        "sped up to that mean rate, whole, through perf_analyzer's custom intervals. The highest speed-up that held: "
        + (", ".join(speeds) if speeds else "none")
        + ".",
        "",
    ]


def _sustained(found: SustainableRate | None) -> str:
    """The sustainable rate a plan counts on; a lower bound is marked ≥."""
    if not found or found.sustained_rps is None:
        return _fmt(None)
    return ("≥ " if found.lower_bound else "") + _fmt(found.sustained_rps)


def _configs_label(a: PoolAnswer) -> str:
    """The chosen configuration; a pipeline's, step by step."""
    if not a.steps:
        return _config_label(a.configuration)
    return "; ".join(f"{step}: {_config_label(c)}" for step, c in a.steps.items())


def _config_label(c: dict) -> str:
    preferred = ",".join(map(str, c.get("preferred_batch_sizes") or [])) or "none"
    fmt = f"{c['format']}, " if c.get("format") else ""
    yours = " (your config as written: no candidate of this step met the SLO)" if c.get("yours") else ""
    return (
        f"{fmt}{c['instances']} instance(s), max batch {c['max_batch_size']}, preferred {preferred}, "
        f"delay {c['queue_delay_us']} µs{yours}"
    )


def _pool_section(a: PoolAnswer, cap: CapacityRequest) -> list[str]:
    lines = [f"## {a.pool or 'This machine'} ({a.hardware or 'unknown hardware'})", ""]
    if a.run_url:
        lines += [f"Run folder: `{a.run_url}`", ""]
    if a.reason:
        lines += [f"{a.reason}.", ""]
    if a.candidates:
        lines += ["| configuration | status | sustainable rate (req/s) | rates measured |", "|---|---|---|---|"]
        for c in a.candidates:
            status = c["status"] + (f": {c['error']}" if c.get("error") else "")
            lines.append(f"| `{c['key']}` | {status} | {_fmt(c.get('rate_rps'))} | {c.get('points', 0)} |")
        lines.append("")
    if a.rate:
        lines += [
            f"The chosen configuration's rate search ({len(a.rate.points)} rates, {a.rate.seconds:.0f} s): "
            f"{a.rate.stopped}.",
            "",
            f"| order | offered (req/s) | verdict | p{cap.rule.percentile} (ms) | served (infer/s) | requests | "
            "sent late % | why |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for i, p in enumerate(a.rate.points, 1):
            lines.append(
                f"| {i} | {p.rate:.4g} | {p.status} | {_fmt(p.latency_ms)} | {_fmt(p.throughput)} "
                f"| {_fmt(p.requests, 'd')} | {_fmt(p.delayed_pct)} | {p.reason} |"
            )
        lines.append("")
    return lines


def _prices_section(answers: list[PoolAnswer]) -> list[str]:
    priced = [a.price for a in answers if a.price]
    if not priced:
        return []
    lines = ["## Prices", "", "| pool | $/h | provider | instance | date | source |", "|---|---|---|---|---|---|"]
    for p in priced:
        lines.append(
            f"| {p.get('pool')} | {p.get('usd_per_hour')} | {p.get('provider') or ''} | {p.get('instance') or ''} "
            f"| {p.get('price_date') or ''} | {p.get('source') or ''} |"
        )
    return lines + ["", "Edit the table (or pass your own with `prices`) to plan with your own prices.", ""]


def write_capacity_files(run_dir: Path, answers: list[PoolAnswer], cap: CapacityRequest, model: str) -> str:
    """capacity.json, capacity.md, capacity.html and plots/capacity.png in `run_dir`; returns the markdown."""
    plot = plot_latency_vs_rate(answers, cap, run_dir / "plots" / "capacity.png")
    text = capacity_markdown(answers, cap, model, plot.relative_to(run_dir).as_posix())
    (run_dir / CAPACITY_MD).write_text(text)
    write_html_report(run_dir / CAPACITY_MD, run_dir / "capacity.html")
    payload = {
        "request": cap.model_dump(mode="json"),
        "answers": [a.model_dump(mode="json") for a in ranked(answers)],
    }
    (run_dir / CAPACITY_JSON).write_text(json.dumps(payload, indent=2))
    return text


def read_answers(run_url: str) -> list[PoolAnswer]:
    """The answers a run stored in its capacity.json (local or in the artifact store), ranked; [] where it has none."""
    fs, path = url_to_fs(f"{run_url}/{CAPACITY_JSON}")
    if not fs.exists(path):
        return []
    with fs.open(path, "r") as f:
        return [PoolAnswer.model_validate(a) for a in json.load(f)["answers"]]


def answers_table(answers: list[PoolAnswer]) -> pd.DataFrame:
    """One row per pool, ranked: for the CLI's summary and the matrix-style gathering."""
    rows = []
    for a in ranked(answers):
        rows.append(
            {
                "pool": a.pool,
                "status": a.status,
                "rate_rps": a.rate.rate if a.rate else None,
                "instances": a.plan.instances if a.plan else None,
                "usd_per_million": a.plan.usd_per_million if a.plan else None,
            }
        )
    return pd.DataFrame(rows)
