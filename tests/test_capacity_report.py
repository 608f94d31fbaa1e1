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
