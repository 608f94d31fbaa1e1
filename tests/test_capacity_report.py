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


def test_no_rate_says_why_the_first_configurations_search_stopped(tmp_path):
    """A search cut by its time budget before any rate was decided is not every rate failing: the answer says which."""
    from tbench.capacity.evaluate import rate_search_path
    from tbench.capacity.rate_search import SustainableRate
    from tbench.capacity.report import pool_answer
    from tbench.search.objective import Objective, Observation
    from tbench.search.space import Candidate
    from tbench.search.strategies import SearchResult

    candidate = Candidate(instances=1, max_batch_size=8)
    path = rate_search_path(tmp_path, candidate)
    path.parent.mkdir(parents=True)
    path.write_text(SustainableRate(stopped="the time budget (60 s) was spent").model_dump_json())
    result = SearchResult(
        strategy="exhaustive",
        objective=Objective(p99_budget_ms=50),
        grid_size=1,
        budget=1,
        observations=[Observation(candidate=candidate, status="unstable")],
    )
    answer = pool_answer(result, tmp_path, CapacityRequest(), model="m", pool="cpu", hardware="CPU")
    assert answer.status == "no_rate" and answer.reason == (
        "no configuration met the SLO at any rate measured (the first configuration's search: the time budget (60 s) "
        "was spent)"
    )
