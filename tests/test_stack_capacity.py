"""Capacity plans through the local stack: `tbench capacity --pools cpu` (a subprocess with nothing but the stack's
environment) submits one child run to the cpu pool's capacity deployment, whose worker plans on this machine; the
ranked report and the child's answer are read back from S3. And the same deployment's "Custom run" form in the Prefect
UI (Debian's chromium through selenium): the CapacityRequest fields with their descriptions, and a run submitted from
the form's JSON input that the cpu worker completes.

The runs are as small as a capacity plan gets: the small ResNet-50, one configuration, p90 (139 requests a rate
point), at most three rate points with a loose tolerance."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from browser import console_log, headless_chromium, needs_chromium, open_until, request_outcomes
from conftest import running_stack
from test_stack_e2e import TBENCH, in_stack

from tbench.capacity.request import CapacityRequest
from tbench.request.benchmark import BenchmarkRequest
from tbench.team.stack import Stack

pytestmark = pytest.mark.e2e

DEPLOYMENT = "triton-capacity/capacity-cpu"
SMALL_CAPACITY = {
    "request": {"model": "resnet50", "size": "small", "measurement": {"window_s": 0.1, "stability_percentage": 50}},
    "capacity": {
        "slo_ms": 200,
        "traffic_rps": 20,
        "rule": {"percentile": 90},
        "space": {"instances": [1], "max_batch_sizes": [4], "preferred": ["none"], "queue_delays_us": [500]},
        "max_points": 3,
        "tolerance": 0.5,
    },
}


def read_json(url: str) -> dict:
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    return json.loads(fs.cat_file(path))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The stack with the cpu pool only: its deployments (benchmark, search, capacity, matrix) and its worker."""
    yield from running_stack(tmp_path_factory.mktemp("stack"), pools=("cpu",))


def run_folders(stack: Stack) -> set[str]:
    """The run folders in the stack's artifact store, read afresh."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(stack.artifact_root)
    fs.invalidate_cache()
    return {p.rsplit("/", 1)[1] for p in fs.ls(path, detail=False)} if fs.exists(path) else set()


def assert_cpu_answer(answer: dict) -> None:
    assert answer["pool"] == "cpu" and answer["status"] == "ok", answer
    assert answer["rate"]["rate"] > 0 and answer["plan"]["sustainable_rps"] > 0, answer
    assert answer["plan"]["instances"] >= 1 and answer["plan"]["traffic_rps"] == 20, answer["plan"]
    assert answer["plan"]["usd_per_million"] > 0, answer["plan"]  # the shipped price table has the cpu pool
    assert [c["status"] for c in answer["candidates"]] == ["ok"], answer["candidates"]


def test_capacity_from_the_cli_runs_on_the_cpu_pools_capacity_deployment(stack, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    argv = [
        TBENCH,
        "capacity",
        "resnet50",
        "--size",
        "small",
        "--pools",
        "cpu",
        "--slo-p99-ms",
        "200",
        "--traffic",
        "20",
        "--percentile",
        "90",
        "--instances",
        "1",
        "--max-batch-sizes",
        "4",
        "--max-points",
        "3",
        "--tolerance",
        "0.5",
        "--window-s",
        "0.1",
        "--stability",
        "50",
        "-o",
        stack.artifact_root,
    ]
    done = in_stack(stack, argv, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    url = done.stdout.strip().splitlines()[-1]
    assert url.startswith(stack.artifact_root + "/resnet50-capacity-pools"), done.stdout
    for key, value in stack.client_env().items():  # S3 for fsspec in this process
        monkeypatch.setenv(key, value)
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    assert fs.exists(path + "/capacity.md") and fs.exists(path + "/capacity.html")
    report = read_json(url + "/capacity.json")
    assert report["request"]["slo_ms"] == 200 and report["request"]["rule"]["percentile"] == 90
    [answer] = report["answers"]
    assert_cpu_answer(answer)
    assert answer["run_url"].startswith(stack.artifact_root + "/resnet50-")  # the child's own run folder
    assert read_json(answer["run_url"] + "/capacity.json")["answers"][0]["status"] == "ok"
    assert "cpu" in fs.cat_file(path + "/capacity.md").decode()
    parent = read_json(url + "/manifest.json")
    assert not Path(parent["local_dir"]).exists()  # stored: the parent's folder leaves staging too
    [child] = parent["runs"]
    assert child["state"] == "COMPLETED" and child["pool"] == "cpu", child
    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        run = client.read_flow_run(uuid.UUID(child["flow_run"]))
        deployment = client.read_deployment(run.deployment_id)
        flow = client.read_flow(deployment.flow_id)
    assert f"{flow.name}/{deployment.name}" == DEPLOYMENT and run.work_pool_name == "cpu"
    assert run.parameters["capacity"]["pool"] == "cpu" and run.parameters["capacity"]["pools"] == []


@needs_chromium
def test_capacity_from_the_prefect_ui_form_runs_on_the_cpu_worker(stack, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    from tbench.team.submit import follow

    for key, value in stack.client_env().items():  # S3 for fsspec in this process
        monkeypatch.setenv(key, value)
    stored_before = run_folders(stack)
    browser = headless_chromium(logs=True, eager=True)  # the console and the network log for a failure's report
    ui = stack.api_url.removesuffix("/api")
    try:
        with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
            deployment_id = client.read_deployment_by_name(DEPLOYMENT).id
        open_until(browser, f"{ui}/deployments", "capacity-cpu")  # the list, as a user opens it (one pool: one page)
        link = next(a for a in browser.find_elements(By.TAG_NAME, "a") if a.text.strip() == "capacity-cpu")
        deployment_page = link.get_attribute("href").rstrip("/")
        assert deployment_page.endswith(str(deployment_id))
        form = open_until(browser, f"{deployment_page}/run", "The latency SLO in ms")  # Run > Custom run
        for text in (
            "Slo Ms",
            "The latency SLO in ms, on the percentile (p99 by default).",
            "Traffic Rps",
            "The traffic to serve, in requests per second.",
            "Spare capacity above the traffic (0.2: 20%).",
            CapacityRequest.model_fields["repeats"].description,
            # the BenchmarkRequest beside it, as every deployment's form shows it
            "Registered model adapter name",
            "Batch Sizes",
            BenchmarkRequest.model_fields["batch_sizes"].description,
            BenchmarkRequest.model_fields["concurrency"].description,
            "Artifact root: a local folder or any fsspec URL",
            "Reuse Measurements",
        ):
            assert text in form, text
        # the parameters as JSON (the form's own "Use JSON input"), small enough to finish in minutes
        heading = browser.find_element(By.XPATH, "//h3[normalize-space()='Parameters']")
        heading.find_element(By.XPATH, "following::button[1]").click()
        WebDriverWait(browser, 30).until(
            lambda b: b.find_elements(By.XPATH, "//*[normalize-space(text())='Use JSON input']")
        )
        browser.find_element(By.XPATH, "//*[normalize-space(text())='Use JSON input']").click()

        def parameters_json(b):  # the code input holding all the parameters (nested fields may have their own)
            inputs = b.find_elements(By.CSS_SELECTOR, ".schema-input textarea.p-code-input__textarea")
            return next((i for i in inputs if '"capacity"' in (i.get_attribute("value") or "")), None)

        editor = WebDriverWait(browser, 30).until(parameters_json)
        editor.send_keys(Keys.CONTROL, "a")
        editor.send_keys(Keys.DELETE)
        editor.send_keys(json.dumps(SMALL_CAPACITY))

        def typed(_) -> bool:  # what the editor holds: its own bracket pairing can run behind the keys under load
            try:
                return json.loads(editor.get_attribute("value") or "") == SMALL_CAPACITY
            except ValueError:
                return False

        try:
            WebDriverWait(browser, 20).until(typed)
        except TimeoutException:  # set it whole, as the editor's input event reports it, and check again
            print(f"the editor held {editor.get_attribute('value')!r}: set whole")
            browser.execute_script(
                "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input', {bubbles: true}));",
                editor,
                json.dumps(SMALL_CAPACITY),
            )
            WebDriverWait(browser, 10).until(typed)
        from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

        def deployment_runs() -> set:  # the CLI test's child ran on this deployment too
            with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
                runs = client.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
                )
            return {r.id for r in runs}

        runs_before = deployment_runs()
        # one click, as a user's: the server's SQLite transactions wait their turn (tbench.team.prefect_server), so a
        # concurrent write no longer fails the submission with a 503 that the UI does not retry
        next(b for b in browser.find_elements(By.TAG_NAME, "button") if b.text.strip() == "Submit").click()
        [run_id] = WebDriverWait(browser, 90).until(lambda _: deployment_runs() - runs_before)
    except Exception:  # what the browser showed, for the failure's report
        browser.save_screenshot(str(stack.root / "ui-failure.png"))
        (stack.root / "ui-failure.html").write_text(browser.page_source)
        print(f"the page at the failure: {stack.root / 'ui-failure.png'} ({browser.current_url})")
        print("the browser's console:", console_log(browser))
        print("the API calls that failed:", request_outcomes(browser.get_log("performance"))[1])
        raise
    finally:
        browser.quit()
    lines: list[str] = []
    with temporary_settings({PREFECT_API_URL: stack.api_url}):
        started = time.monotonic()
        result = follow(run_id, lines.append, timeout_s=900)
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(run_id)
            deployment = client.read_deployment(run.deployment_id)
    assert result.state == "COMPLETED", (result, lines[-30:], time.monotonic() - started)
    assert deployment.name == "capacity-cpu" and run.work_pool_name == "cpu"
    assert run.parameters["capacity"]["slo_ms"] == 200, run.parameters
    [folder] = [f for f in run_folders(stack) - stored_before if f.startswith("resnet50-")]  # the run's, stored
    report = read_json(f"{stack.artifact_root}/{folder}/capacity.json")
    assert report["request"]["max_points"] == 3 and report["request"]["space"]["instances"] == [1]
    [answer] = report["answers"]
    assert_cpu_answer(answer)


def test_a_fleet_node_of_another_pool_is_measured_by_that_pools_colocated_deployment(stack, tmp_path, monkeypatch):
    """`tbench fleet --fan-out` on a machine that says it is a t4 node: the plan's shared node is on the cpu pool, so
    the cpu pool's colocated deployment measures it, its worker fetching the repository the fleet run uploaded to S3,
    and the plan reads its verdict back. The fleet deployment's form takes the same request."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tbench.capacity.fleet_report import FLEET_JSON
    from tbench.capacity.request import FleetRequest
    from tbench.triton.sleeper import sleeper_repository

    sleeper_repository(tmp_path / "repo", 5, name="fast")  # capacity 200/s
    sleeper_repository(tmp_path / "repo", 10, name="slow")  # capacity 100/s
    (tmp_path / "fleet.yaml").write_text(
        "headroom: 0.2\npools:\n  - {name: cpu, usd_per_hour: 0.1}\nmodels:\n"
        "  - {name: fast, traffic_rps: 30, slo_ms: 80, percentile: 90, sustainable_rps: {cpu: 200}, repository: repo}\n"
        "  - {name: slow, traffic_rps: 15, slo_ms: 80, percentile: 90, sustainable_rps: {cpu: 100}, repository: repo}\n"
    )
    argv = [TBENCH, "fleet", str(tmp_path / "fleet.yaml"), "--pool", "t4", "--fan-out", "-o", stack.artifact_root]
    done = in_stack(stack, argv, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    url = done.stdout.strip().splitlines()[-1]
    for key, value in stack.client_env().items():  # S3 for fsspec in this process
        monkeypatch.setenv(key, value)
    record = read_json(f"{url}/{FLEET_JSON}")
    [node] = record["confirmations"]
    # whole, with its reason and points: pytest's repr cuts a long dict off at "..." (one failure under a loaded suite
    # showed only held False)
    assert node["pool"] == "cpu" and node["held"] is True and node["models"] == ["fast", "slow"], json.dumps(node)
    assert node["folder"].startswith(stack.artifact_root + "/colocated-"), node  # the child's own run folder
    assert {p["slo"] for p in node["points"].values()} <= {"pass", "client_bound"}, node["points"]
    assert read_json(node["folder"] + "/manifest.json")["request"]["repositories"][0].startswith(
        stack.artifact_root + "/inputs/"
    )  # the repository, uploaded: the worker read it from the store
    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        form = client.read_deployment_by_name("triton-fleet/fleet-cpu").parameter_openapi_schema
    assert FleetRequest.model_fields["fan_out"].description in json.dumps(form)
