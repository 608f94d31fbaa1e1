from tbench.capacity.report import PoolAnswer, capacity_markdown
from tbench.capacity.request import CapacityRequest


def test_a_plan_says_what_arrivals_it_was_measured_on(tmp_path):
    answers = [PoolAnswer(pool="cpu", model="m", status="no_rate", reason="no configuration met the SLO")]
    bursty = capacity_markdown(answers, CapacityRequest(burstiness=3.0), "m")
    assert "Bursty arrivals: at each rate, gamma intervals whose coefficient of variation is 3" in bursty
    assert "one perf_analyzer run with bursty (gamma) arrivals" in bursty
    trace = tmp_path / "t.txt"
    trace.write_text("0\n0.5\n2\n")
    assert f"Traffic from the trace {trace} (mean 1 requests/s" in capacity_markdown(
        answers, CapacityRequest(trace=str(trace)), "m"
    )
    poisson = capacity_markdown(answers, CapacityRequest(), "m")
    assert "Bursty" not in poisson and "trace" not in poisson and "run with Poisson arrivals" in poisson


def test_a_pipelines_plan_names_each_steps_config_and_one_kept_as_written():
    """A step none of whose candidates met the SLO is served as the user wrote it: the plan names that config and
    says so; the time limit, where one was given, is in the method."""
    searched = {"instances": 1, "max_batch_size": 8, "preferred_batch_sizes": [], "queue_delay_us": 500}
    yours = {"instances": 2, "max_batch_size": 8, "preferred_batch_sizes": [4], "queue_delay_us": 200, "yours": True}
    answer = PoolAnswer(
        pool="cpu", model="pipeline", configuration=searched, steps={"doubler": yours, "plus_one": searched}
    )
    text = capacity_markdown([answer], CapacityRequest(max_minutes=1.5), "pipeline")
    assert (
        "doubler: 2 instance(s), max batch 8, preferred 4, delay 200 µs (your config as written: no candidate of this "
        "step met the SLO); plus_one: 1 instance(s), max batch 8, preferred none, delay 500 µs |"
    ) in text, text
    assert "or 1.5 min per configuration (--max-minutes)." in text
    assert "per configuration" not in capacity_markdown([answer], CapacityRequest(), "pipeline")


def _answer_of(tmp_path, searches):
    """pool_answer of a configuration search none of whose candidates passed, each with the rate search given."""
    from tbench.capacity.evaluate import rate_search_path
    from tbench.capacity.report import pool_answer
    from tbench.search.objective import Objective, Observation
    from tbench.search.space import Candidate
    from tbench.search.strategies import SearchResult

    observations = []
    for instances, search in enumerate(searches, start=1):
        candidate = Candidate(instances=instances, max_batch_size=8)
        if search is not None:
            path = rate_search_path(tmp_path, candidate)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(search.model_dump_json())
        observations.append(Observation(candidate=candidate, status="unstable", error="" if search else "no server"))
    result = SearchResult(
        strategy="exhaustive",
        objective=Objective(p99_budget_ms=50),
        grid_size=len(searches),
        budget=len(searches),
        observations=observations,
    )
    return pool_answer(result, tmp_path, CapacityRequest(), model="m", pool="cpu", hardware="CPU")


def test_a_search_cut_by_its_budget_is_undetermined_not_no_rate(tmp_path):
    """A rate search stopped by its time budget before any rate was decided is not every rate failing: the answer is
    undetermined and says which search stopped and what would decide; only searches that each failed down to their
    lowest rate make no_rate."""
    from tbench.capacity.rate_search import SustainableRate
    from tbench.capacity.report import AnswerStatus

    spent = SustainableRate(stopped="the time budget (60 s) was spent")
    failed = SustainableRate(
        stopped="failed down to 0.125/s (the lowest rate tried): fail: p99 too high", ruled_out=True
    )
    answer = _answer_of(tmp_path / "cut", [failed, spent])
    assert answer.status is AnswerStatus.UNDETERMINED and answer.rate == spent
    assert answer.reason == (
        "no configuration was shown to meet the SLO before 1 of 2 rate searches stopped undecided (the first: the time "
        "budget (60 s) was spent); a larger budget (--max-minutes, --max-points) would decide"
    )
    answer = _answer_of(tmp_path / "failed", [failed, failed])
    assert answer.status is AnswerStatus.NO_RATE and answer.rate == failed
    assert answer.reason == (
        "every rate failed the SLO (the first configuration's search: failed down to 0.125/s (the lowest rate tried): "
        "fail: p99 too high)"
    )
    answer = _answer_of(tmp_path / "none", [None])
    assert answer.status is AnswerStatus.UNDETERMINED and answer.reason == (
        "no configuration's rate search ran (the first: no server)"
    )
    assert f"**{answer.status}**" in capacity_markdown([answer], CapacityRequest(), "m")  # the value, not the member


def test_the_capacity_command_exits_2_on_an_undetermined_answer_and_says_each_answer_that_is_no_plan(tmp_path, capsys):
    """A script reads the exit code: undetermined is 2 (as tbench compare's), a plan or no_rate is 0; every answer that
    is not a plan is one line on stderr."""
    import json

    import pytest
    import typer

    from tbench.capacity.report import CAPACITY_JSON, AnswerStatus
    from tbench.cli.common import EXIT_UNDETERMINED
    from tbench.cli.search import _answered

    def folder(name: str, *answers: PoolAnswer) -> str:
        run = tmp_path / name
        run.mkdir()
        (run / CAPACITY_JSON).write_text(json.dumps({"answers": [a.model_dump(mode="json") for a in answers]}))
        return str(run)

    ok = PoolAnswer(pool="a100", model="m")
    spent = PoolAnswer(pool="cpu", model="m", status=AnswerStatus.UNDETERMINED, reason="the time budget was spent")
    failing = PoolAnswer(pool="t4", model="m", status=AnswerStatus.NO_RATE, reason="every rate failed the SLO")
    with pytest.raises(typer.Exit) as ended:
        _answered(folder("cut", ok, spent, failing))
    assert ended.value.exit_code == EXIT_UNDETERMINED
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "undetermined: cpu: the time budget was spent",
        "no_rate: t4: every rate failed the SLO",
    ]
    _answered(folder("answered", ok, failing))  # no exit: both are answers
    _answered(str(tmp_path / "no-answer"))  # a run folder without capacity.json: nothing to say
