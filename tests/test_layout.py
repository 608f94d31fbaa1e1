import datetime as dt
import re

from tbench.core.enums import Scenario
from tbench.core.layout import RunLayout, new_run_id


def test_run_id_is_model_time_and_a_random_suffix():
    when = dt.datetime(2026, 11, 22, 10, 5, 7, tzinfo=dt.UTC)
    run_id = new_run_id("resnet50", when)
    assert re.fullmatch(r"resnet50-20261122-100507-[0-9a-f]{6}", run_id)
    assert new_run_id("resnet50", when) != run_id


def test_every_artifact_lives_under_the_run_folder(tmp_path):
    layout = RunLayout(tmp_path, "r1").create()
    assert layout.run_dir == tmp_path / "r1"
    for d in (layout.models_dir, layout.logs_dir, layout.plots_dir, layout.perf_dir):
        assert d.is_dir() and d.parent == layout.run_dir
    assert layout.manifest_json.name == "manifest.json" and layout.report_md.name == "report.md"
    assert layout.results_csv.parent == layout.results_parquet.parent == layout.run_dir
    assert layout.server_log == layout.logs_dir / "tritonserver.log"
    csv = layout.perf_csv("resnet50", Scenario.ONLINE, "b1_c8", attempt=1)
    assert csv == layout.perf_dir / "resnet50_online_b1_c8_try1.csv"
    assert layout.perf_log("resnet50", Scenario.ONLINE, "b1_c8", 1).is_relative_to(layout.logs_dir)
