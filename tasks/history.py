"""After a run is stored: its model's history judged and the static site refreshed (tbench.history), a link to the site
on the flow run's page, each of the run's news in its log (History.news: a change it confirmed, a point it lost), and,
where that news is a regression (a confirmed regression, a point lost behind or to an error), a Prefect event that an
automation can act on (`tbench.history.regressed`): once per change, from the run that confirms it, however late, and
once per lost point, from the run that lost it (History.regressed). A point lost to a status that cannot say why
(unstable, not measured) leaves the verdict undetermined and is not posted. A history that cannot be read or written
is a warning, never the run's failure."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_link_artifact
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event

from tbench.history.alerts import REGRESSED_EVENT

HISTORY_LINK_KEY = "benchmark-history"


@task(name="history", cache_policy=NO_CACHE)
def history_task(root_url: str, model: str, run_id: str) -> str | None:
    # imported here: the analysis and the site's plots (pandas, matplotlib) take a second to import, and every run
    # imports this module before its first stage; ruptures (and scipy.stats) only where a series is long enough
    from tbench.history.analysis import analyse
    from tbench.history.site import default_target, publish_site

    logger = get_run_logger()
    try:
        judged = analyse(root_url, model=model)
        index = publish_site(judged, default_target(root_url))
    except Exception as err:  # the run is stored; its history is a view of it
        logger.warning("the history of %s was not refreshed: %s", model, err)
        return None
    create_link_artifact(
        index, link_text=f"History of {model}", key=HISTORY_LINK_KEY, description="Every series of the model, judged"
    )
    for told in judged.news(run_id):  # a regression's line says "regression", a lost point's "lost"
        logger.warning("history: %s", told.line())
    if regressed := judged.regressed(run_id):
        emit_regressed(model, run_id, index, [told.line() for told in regressed])
    return index


def emit_regressed(model: str, run_id: str, site: str, lines: list[str]) -> None:
    """The event an automation acts on (tbench.history.alerts): the model as its resource, the run related, the lines
    in its payload."""
    emit_event(
        event=REGRESSED_EVENT,
        resource={"prefect.resource.id": f"tbench.model.{model}", "prefect.resource.name": model},
        related=[{"prefect.resource.id": f"tbench.stages.tracker.{run_id}", "prefect.resource.role": "run"}],
        payload={"run_id": run_id, "site": site, "regressions": lines},
    )
