"""Stage 9: the run folder to the artifact store: the Prefect task; the logic is in tbench.stages.store."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_link_artifact
from prefect.cache_policies import NO_CACHE

from tbench.results.dataset import add_run_to_dataset
from tbench.stages.store import MANIFEST, is_local, manifest_text, upload_run, write_local_atomic
from tbench.team.submit import REPORT_LINK_KEY

REPORT_PAGES = ("report.html", "capacity.html", "search.html", "fleet.html", "colocated.html")


@task(name="store", cache_policy=NO_CACHE)
def store_task(run_dir: Path, root_url: str, run_id: str, manifest: dict) -> str:
    text = manifest_text(run_dir, manifest)  # once: it hashes every file of the run
    try:
        write_local_atomic(run_dir / MANIFEST, text)
        unwritten = None
    except OSError:  # a full disk: the manifest goes to the store from memory, after every other file of the run
        if is_local(root_url):
            raise
        unwritten = text
    url = upload_run(run_dir, root_url, run_id, manifest_text=unwritten)
    add_run_to_dataset(run_dir, root_url, run_id, manifest.get("status"))  # queries can leave out incomplete runs
    # where the stored report is, one click from the flow run's page (and how the matrix, capacity and fleet plans
    # find a child's folder): its HTML report, else (a run that failed before it) its manifest
    report = next((name for name in REPORT_PAGES if (run_dir / name).exists()), "manifest.json")
    create_link_artifact(
        f"{url}/{report}",
        link_text=f"{'HTML report' if report != 'manifest.json' else 'manifest'} of {run_id}",
        key=REPORT_LINK_KEY,
        description="The run's self-contained HTML report in the artifact store",
    )
    return url
