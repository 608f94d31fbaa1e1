"""The configuration search over the user's own config.pbtxt (`tbench search --repository DIR --model NAME`): each
candidate edits only the fields the search varies (search/config_edit.py), everything else as the user wrote it; and on
the real embedded server, a tiny ONNX model of a repository searched end to end, the user's config measured beside
the best and the recommended config.pbtxt written out."""

from __future__ import annotations

import json

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tbench.capacity.report import AnswerStatus
from tbench.core.errors import ConfigError
from tbench.search.config_edit import candidate_of, edited_config, thread_parameter, to_text
from tbench.search.plan import searchable_model, step_space
from tbench.search.request import SearchRequest
from tbench.search.space import Candidate, SearchSpace

ONNX_CONFIG = """
name: "doubler"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 4 ] }
dynamic_batching { max_queue_delay_microseconds: 200 preferred_batch_size: [ 4 ] priority_levels: 2
  default_priority_level: 1 }
instance_group { count: 2 kind: KIND_CPU }
instance_group { count: 1 kind: KIND_CPU }
version_policy { specific { versions: [ 1, 3 ] } }
parameters { key: "intra_op_thread_count" value { string_value: "1" } }
parameters { key: "enable_mem_pattern" value { string_value: "0" } }
"""

PYTHON_CONFIG = """
backend: "python"
max_batch_size: 8
input { name: "y" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "z" data_type: TYPE_FP32 dims: [ 4 ] }
instance_group { count: 1 kind: KIND_CPU }
parameters { key: "my_option" value { string_value: "on" } }
"""

RUNTIME_CONFIG = PYTHON_CONFIG + 'parameters { key: "runtime" value { string_value: "onnxruntime" } }\n'

NO_BATCH_CONFIG = """
platform: "pytorch_libtorch"
max_batch_size: 0
input { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 4 ] }
output { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3, 4 ] }
"""

CANDIDATE = Candidate(instances=3, max_batch_size=16, preferred_batch_sizes=(8, 16), queue_delay_us=500)


def parse(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def round_trip(config: mc.ModelConfig) -> mc.ModelConfig:
    """As written to config.pbtxt and read back by Triton's schema."""
    return parse(to_text(config))


def test_an_onnx_config_changes_only_what_the_search_varies():
    base = parse(ONNX_CONFIG)
    edited = round_trip(edited_config(base, CANDIDATE, threads=2))
    assert edited.max_batch_size == 16 and [g.count for g in edited.instance_group] == [3]
    assert edited.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    batcher = edited.dynamic_batching
    assert list(batcher.preferred_batch_size) == [8, 16] and batcher.max_queue_delay_microseconds == 500
    assert (batcher.priority_levels, batcher.default_priority_level) == (2, 1)  # the user's, as written
    params = {k: v.string_value for k, v in edited.parameters.items()}
    assert params == {"intra_op_thread_count": "2", "enable_mem_pattern": "0"}
    assert list(edited.version_policy.specific.versions) == [1, 3]
    assert edited.input == base.input and edited.output == base.output and edited.name == "doubler"
    assert base == parse(ONNX_CONFIG)  # the base itself is not changed


def test_the_users_kind_and_devices_are_kept():
    base = parse(ONNX_CONFIG.replace("count: 2 kind: KIND_CPU", "count: 2 kind: KIND_GPU gpus: [ 1 ]"))
    group = edited_config(base, CANDIDATE, threads=1).instance_group[0]
    assert (group.count, group.kind, list(group.gpus)) == (3, mc.ModelInstanceGroup.KIND_GPU, [1])


def test_a_python_model_gets_threads_only_where_it_is_tbenchs_runtime():
    own = edited_config(parse(PYTHON_CONFIG), CANDIDATE, threads=2)
    assert {k: v.string_value for k, v in own.parameters.items()} == {"my_option": "on"}
    assert own.max_batch_size == 16 and list(own.dynamic_batching.preferred_batch_size) == [8, 16]
    runtime = edited_config(parse(RUNTIME_CONFIG), CANDIDATE, threads=2)
    assert runtime.parameters["intra_op_threads"].string_value == "2"
    assert thread_parameter(parse(NO_BATCH_CONFIG)) == "INTRA_OP_THREAD_COUNT"


def test_a_model_without_a_batch_axis_varies_instances_and_threads_only():
    base = parse(NO_BATCH_CONFIG)
    edited = round_trip(edited_config(base, Candidate(instances=2, max_batch_size=0), threads=1))
    assert edited.max_batch_size == 0 and not edited.HasField("dynamic_batching")
    assert edited.instance_group[0].count == 2 and edited.instance_group[0].kind == mc.ModelInstanceGroup.KIND_AUTO
    assert edited.parameters["INTRA_OP_THREAD_COUNT"].string_value == "1"


def test_a_sequence_models_batcher_is_kept_as_written():
    base = parse(NO_BATCH_CONFIG.replace("max_batch_size: 0", "max_batch_size: 4") + "sequence_batching { }")
    edited = edited_config(base, CANDIDATE, threads=1)
    assert edited.WhichOneof("scheduling_choice") == "sequence_batching" and edited.max_batch_size == 4


def test_the_users_config_as_the_searchs_coordinates():
    assert candidate_of(parse(ONNX_CONFIG)) == Candidate(
        instances=3, max_batch_size=8, preferred_batch_sizes=(4,), queue_delay_us=200
    )
    assert candidate_of(parse(NO_BATCH_CONFIG)) == Candidate(instances=1, max_batch_size=0)


def test_a_pipeline_of_pipelines_is_refused_in_one_line(tmp_path):
    import test_user_repository as users

    users.write_model(tmp_path, "inner", 'platform: "ensemble"\nmax_batch_size: 1')
    outer = 'platform: "ensemble"\nmax_batch_size: 1\nensemble_scheduling { step { model_name: "inner" } }'
    users.write_model(tmp_path, "outer", outer)
    with pytest.raises(
        ConfigError, match=r"outer/config.pbtxt: ensemble_scheduling.step\[0\].model_name 'inner' is an"
    ):
        searchable_model(tmp_path, "outer")


def test_a_steps_grid_takes_no_max_batch_below_the_pipelines():
    search = SearchRequest(space=SearchSpace(max_batch_sizes=[1, 2, 4, 8, 16]))
    assert step_space(search, 8, 4).space.max_batch_sizes == [4, 8, 16]
    assert step_space(search, 8, 32).space.max_batch_sizes == [32]  # none above: the pipeline's own
    assert step_space(search, 0, 0).space.max_batch_sizes == [0]  # no batch axis: instances only


def test_the_cli_refuses_an_ensemble_and_run_only_options_in_one_line(tmp_path):
    import test_user_repository as users
    from typer.testing import CliRunner

    from tbench.cli import app

    users.tiny_onnx(users.write_model(tmp_path, "doubler", users.ONNX_CONFIG) / "1" / "model.onnx")
    users.write_model(tmp_path, "plus_one", users.PYTHON_CONFIG, files={"model.py": "# the user's"})
    users.write_model(tmp_path, "pipeline", users.ENSEMBLE_CONFIG)
    for args, why in [
        (["--model", "doubler", "--variants", "onnx"], "--variants does not apply to --repository"),
        (["--model", "doubler", "--resume", str(tmp_path)], "no search checkpoint there (expected search.jsonl"),
        (["--model", "doubler", "--size", "small"], "--size does not apply to --repository"),
    ]:
        result = CliRunner().invoke(app, ["search", "--repository", str(tmp_path), *args])
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert result.exit_code != 0 and len(lines) == 1 and why in lines[0], result.output
    plan = ["capacity", "--repository", str(tmp_path), "--slo-p99-ms", "50", "--traffic", "100"]
    for args, why in [
        (["--model", "doubler", "--pools", "a100"], "--repository plans on this machine"),
        (["--model", "doubler", "--size", "small"], "--size does not apply to --repository"),
    ]:
        result = CliRunner().invoke(app, [*plan, *args])
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert result.exit_code != 0 and len(lines) == 1 and why in lines[0], result.output


def test_a_resume_is_refused_where_the_users_repository_changed_since(tmp_path):
    """A repository search's checkpoint is read back only for the same files, grid and machine: a config edited since
    is named in one line."""
    import test_user_repository as users

    from tbench.node.hardware import Hardware
    from tbench.request.benchmark import BenchmarkRequest
    from tbench.search.plan import CONTEXT, repository_search_context, resumed_checkpoints

    users.tiny_onnx(users.write_model(tmp_path / "repo", "doubler", users.ONNX_CONFIG) / "1" / "model.onnx")
    req = BenchmarkRequest(repository=str(tmp_path / "repo"), repository_model="doubler")
    search = SearchRequest(space=SearchSpace(max_batch_sizes=[2, 4]), concurrency=2)
    machine = Hardware(cpu_model="cpu", cpu_cores=2, memory_gib=8.0, gpus=[], os="Linux")
    context = repository_search_context(req, search, machine)
    assert set(context["repository_files"]) == {"doubler/config.pbtxt", "doubler/1/model.onnx"}
    run = tmp_path / "run"
    run.mkdir()
    (run / "search.jsonl").write_text("")
    (run / CONTEXT).write_text(json.dumps(context))
    assert resumed_checkpoints(str(run), context, ["search.jsonl"]) == {"search.jsonl": run / "search.jsonl"}
    assert resumed_checkpoints(None, context, ["search.jsonl"]) == {}
    (tmp_path / "repo" / "doubler" / "config.pbtxt").write_text(users.ONNX_CONFIG.replace("count: 2", "count: 3"))
    changed = repository_search_context(req, search, machine)
    with pytest.raises(ConfigError, match=r"another repository_files.doubler/config.pbtxt \(see"):
        resumed_checkpoints(str(run / "search.jsonl"), changed, ["search.jsonl"])
    with pytest.raises(ConfigError, match="no search checkpoint there"):
        resumed_checkpoints(str(run), context, ["search-doubler.jsonl"])


def test_the_users_config_against_the_best_says_when_to_keep_it():
    """A search whose space does not hold the user's config may find nothing better: the report says to keep theirs
    where the windows separate it from the best, 'as good' where they cannot, and recommends the best otherwise."""
    from tbench.search.objective import Objective
    from tbench.search.report import AS_GOOD, KEEP_YOURS, RECOMMENDED, users_config_section, yours_against_best
    from tbench.search.strategies import Observation

    objective = Objective(p99_budget_ms=5.0)

    def obs(throughput: float, p99: float = 2.0, cv: float = 0.02) -> Observation:
        return Observation(
            candidate=CANDIDATE, throughput=throughput, p99_ms=p99, throughput_cv=cv, latency_cv=cv, windows=9
        )

    best = obs(1261.0)
    assert yours_against_best(objective, obs(1664.0), best) == KEEP_YOURS
    assert yours_against_best(objective, obs(1270.0), best) == AS_GOOD
    assert yours_against_best(objective, obs(1000.0), best) == RECOMMENDED
    assert yours_against_best(objective, obs(1664.0, p99=9.0), best) == RECOMMENDED  # over the budget: not a rival
    assert yours_against_best(objective, None, best) is None
    assert yours_against_best(objective, obs(1000.0), best, same=True) == AS_GOOD  # the best is the user's config
    text = users_config_section(obs(1664.0), "yours", best, "best", ["recommended/m/config.pbtxt"], KEEP_YOURS)
    assert "**Keep your config**" in text and "recommended/m/config.pbtxt" in text


def test_the_users_config_measured_first_is_the_candidate_of_the_same_text(tmp_path):
    """The user's config is measured before the search (flows.search.measure_users_config): a candidate whose config
    is the same text is that measurement (no server is asked), any other is measured."""
    import test_user_repository as users

    from tbench.request.benchmark import Measurement
    from tbench.search.evaluate import RepositoryEvaluator
    from tbench.search.strategies import Observation

    base = parse(users.ONNX_CONFIG)  # 2 instances with 1 thread each: on 2 cores the search's own threads
    own = candidate_of(base)
    measured = Observation(candidate=own, throughput=1234.5, p99_ms=2.0, concurrency=4)
    evaluator = RepositoryEvaluator(
        server=None, repository=tmp_path, name="doubler", variants={}, concurrency=8, measurement=Measurement(),
        work_dir=tmp_path, cpu_cores=2, base=base, as_written=measured,
    )  # fmt: skip
    assert evaluator.candidate_config(own) == base and evaluator.is_as_written(own)
    assert evaluator.evaluate(own) == measured and evaluator.evaluations == 1
    other = own.model_copy(update={"instances": 1})  # 2 threads: another text, measured (on the e2e tests' server)
    assert evaluator.candidate_config(other) != base and not evaluator.is_as_written(other)


# ---- on the real embedded server


@pytest.mark.e2e
def test_search_of_an_onnx_model_of_a_repository(tmp_path):
    import test_user_repository as users
    from test_faults import CliRun

    repo = tmp_path / "user_repo"
    users.tiny_onnx(users.write_model(repo, "doubler", users.ONNX_CONFIG) / "1" / "model.onnx")
    before = users.tree_digest(repo)
    args = ["--repository", str(repo), "--model", "doubler", "--instances", "1", "--max-batch-sizes", "2,4"]
    args += ["--preferred", "max", "--queue-delays-us", "500", "--strategy", "exhaustive", "--concurrency", "2"]
    args += ["--confirm-rounds", "0", "--window-s", "0.5", "--stability", "50"]
    run = CliRun(args, tmp_path / "runs", command="search")
    assert run.finish(timeout=500) == 0, run.output
    run_dir = run.run_dir()
    assert users.tree_digest(repo) == before  # the user's folder only read
    summary = json.loads((run_dir / "search.json").read_text())
    assert summary["measured"] == 2 and summary["best"]["status"] == "ok", summary
    yours = summary["your_config"]
    assert yours["status"] == "ok" and yours["throughput"] > 0, yours
    report = (run_dir / "search.md").read_text()
    assert "| Your config | as written (instances 2, max batch 8" in report, report
    assert "queue delay 200 us, intra_op_thread_count 1)" in report  # the user's threads, as written
    assert "intra_op_thread_count" in report and "recommended/doubler/config.pbtxt" in report
    recommended = parse((run_dir / "recommended" / "doubler" / "config.pbtxt").read_text())
    assert recommended.platform == "onnxruntime_onnx"  # the user's own backend, ready to copy back
    assert recommended.max_batch_size == summary["best"]["candidate"]["max_batch_size"]
    assert recommended.version_policy.HasField("all")  # as the user wrote it
    assert recommended.dynamic_batching.max_queue_delay_microseconds == 500
    assert recommended.parameters["intra_op_thread_count"].string_value
    again = CliRun([*args, "--resume", str(run_dir)], tmp_path / "runs", command="search")  # nothing measured anew
    assert again.finish(timeout=300) == 0, again.output
    resumed = json.loads((again.run_dir() / "search.json").read_text())
    assert resumed["new_measurements"] == 0 and resumed["best"] == summary["best"], resumed


@pytest.mark.e2e
def test_capacity_of_a_model_of_a_repository(tmp_path):
    """`tbench capacity --repository DIR --model NAME`: each candidate the user's config edited, judged by its
    sustainable rate under the SLO; the answer, the user's own config judged the same way and the recommended
    config.pbtxt in the run folder; the user's folder only read."""
    import test_user_repository as users
    from test_faults import CliRun

    from tbench.capacity.report import CAPACITY_JSON

    repo = tmp_path / "user_repo"
    users.tiny_onnx(users.write_model(repo, "doubler", users.ONNX_CONFIG) / "1" / "model.onnx")
    before = users.tree_digest(repo)
    args = ["--repository", str(repo), "--model", "doubler", "--slo-p99-ms", "50", "--traffic", "200"]
    args += ["--instances", "1", "--max-batch-sizes", "4", "--queue-delays-us", "500", "--window-s", "0.5"]
    args += ["--percentile", "90"]  # the plan, not the tail: a p90 window holds a tenth of a p99 one's requests
    run = CliRun(args, tmp_path / "runs", command="capacity")
    assert run.finish(timeout=600) == 0, run.output
    run_dir = run.run_dir()
    assert users.tree_digest(repo) == before
    answer = json.loads((run_dir / CAPACITY_JSON).read_text())["answers"][0]
    assert answer["status"] == AnswerStatus.OK and answer["model"] == "doubler", answer
    [candidate] = answer["candidates"]
    # a bracket of rates, or one rate perf_analyzer could not send on time while the server kept up (a lower bound:
    # the search ends there; seen once in a loaded suite, 1.44% of the sends late at 361 req/s)
    bracketed = candidate["points"] >= 2 or answer["rate"]["lower_bound"]
    assert candidate["rate_rps"] > 0 and bracketed, (candidate, answer["rate"]["stopped"])
    yours = json.loads((run_dir / "search.json").read_text())["your_config"]
    assert yours["status"] == "ok" and yours["throughput"] > 0, yours  # the user's config at its sustainable rate
    recommended = parse((run_dir / "recommended" / "doubler" / "config.pbtxt").read_text())
    assert recommended.platform == "onnxruntime_onnx" and recommended.max_batch_size == 4


@pytest.mark.e2e
def test_search_of_an_ensembles_steps(tmp_path):
    import test_user_repository as users
    from test_faults import CliRun

    repo = tmp_path / "user_repo"
    users.tiny_onnx(users.write_model(repo, "doubler", users.ONNX_CONFIG) / "1" / "model.onnx")
    users.write_model(repo, "plus_one", users.PYTHON_CONFIG, files={"model.py": users.PYTHON_MODEL})
    users.write_model(repo, "pipeline", users.ENSEMBLE_CONFIG)
    args = ["--repository", str(repo), "--model", "pipeline", "--instances", "1,2", "--max-batch-sizes", "2,4"]
    args += ["--preferred", "max", "--queue-delays-us", "500", "--strategy", "exhaustive", "--concurrency", "2"]
    args += ["--confirm-rounds", "0", "--window-s", "0.5", "--stability", "50"]
    run = CliRun(args, tmp_path / "runs", command="search")
    assert run.finish(timeout=600) == 0, run.output
    run_dir = run.run_dir()
    summary = json.loads((run_dir / "search.json").read_text())
    assert list(summary["steps"]) == ["doubler", "plus_one"] and summary["measured"] == 4, summary
    for step in summary["steps"].values():  # no max batch below the pipeline's 8: Triton would refuse it
        assert step["best"]["candidate"]["max_batch_size"] == 8, step
    assert summary["your_config"]["status"] == "ok", summary["your_config"]
    assert set(summary["recommended_config"]) == {"doubler", "plus_one"}
    plus_one = parse((run_dir / "recommended" / "plus_one" / "config.pbtxt").read_text())
    assert plus_one.backend == "python" and plus_one.dynamic_batching.max_queue_delay_microseconds == 500
    report = (run_dir / "search.md").read_text()
    assert "## Step doubler" in report and "## Step plus_one" in report and "| Your config |" in report
    assert "plus_one: instances 1, max batch 8, no dynamic batcher)" in report  # the user's, as written


@pytest.mark.e2e
def test_capacity_of_an_ensemble_plans_the_pipeline_with_each_steps_config(tmp_path):
    """`tbench capacity --repository DIR --model ENSEMBLE`: its steps searched one after another, each candidate
    judged by the pipeline's sustainable rate; the plan names every step's configuration."""
    import test_user_repository as users
    from test_faults import CliRun

    from tbench.capacity.report import CAPACITY_JSON, CAPACITY_MD

    repo = users.user_repository(tmp_path / "user_repo")
    args = ["--repository", str(repo), "--model", "pipeline", "--slo-p99-ms", "50", "--traffic", "200"]
    args += ["--instances", "1", "--max-batch-sizes", "8", "--queue-delays-us", "500", "--window-s", "0.5"]
    # three rate searches (the user's config, then each step's candidate), each bounded: on a busy machine its stalls
    # can leave every rate undecided for `repeats` runs (27 min once, unbounded). On p90, whose windows hold a tenth of
    # p99's requests: on p99 each search used its whole minute, and one full suite's ended with no rate decided
    args += ["--repeats", "3", "--max-points", "6", "--max-minutes", "1", "--percentile", "90"]
    run = CliRun(args, tmp_path / "runs", command="capacity")
    assert run.finish(timeout=600) == 0, run.output
    run_dir = run.run_dir()
    answer = json.loads((run_dir / CAPACITY_JSON).read_text())["answers"][0]
    assert answer["status"] == AnswerStatus.OK and answer["model"] == "pipeline", answer
    steps = answer["steps"]
    assert list(steps) == ["doubler", "plus_one"] and answer["plan"]["instances"] >= 1, answer
    assert answer["rate"]["rate"] > 0
    plan = (run_dir / CAPACITY_MD).read_text()
    assert "or 1 min per configuration" in plan, plan
    # each step at its one candidate (1 instance, max batch 8), or, where that met the SLO at no rate within the time
    # limit (a busy machine's first step), at the user's own config, served as written and said so
    searched = {step for step, config in steps.items() if not config.get("yours")}
    assert "plus_one" in searched, steps  # the plan's rate is the last step's candidate's
    for step, config in steps.items():
        label = f"{step}: {config['instances']} instance(s), max batch {config['max_batch_size']}"
        assert label in plan and (step in searched) != ("your config as written" in plan.split(label)[1][:120]), plan
        assert step not in searched or (config["instances"], config["max_batch_size"]) == (1, 8), config
    assert {p.parent.name for p in (run_dir / "recommended").glob("*/config.pbtxt")} == searched
