"""Being told when a series regresses: a webhook notification block and a Prefect automation that fires it on every
`tbench.history.regressed` event (emitted by the flow's history stage, tasks/history.py), installed on a Prefect
server by `tbench stack up --alert-webhook URL` (or for any server by `install_regression_alert`).

The automation is Prefect's own (event trigger, send-notification action), so a team can see, pause or change it in
the UI like any other; the message names the model, the run, each regression with what differed, and the history site.
"""

from __future__ import annotations

REGRESSED_EVENT = "tbench.history.regressed"
WEBHOOK_BLOCK = "tbench-regression-webhook"
AUTOMATION = "tbench: a series regressed"
SUBJECT = "tbench: {{ event.resource['prefect.resource.name'] }} regressed in run {{ event.payload.run_id }}"
BODY = "{% for line in event.payload.regressions %}{{ line }}\n{% endfor %}History: {{ event.payload.site }}"


def install_regression_alert(webhook_url: str) -> str:
    """The webhook block and the automation on the Prefect server at PREFECT_API_URL (an earlier automation of the
    same name is replaced, so re-running set-up keeps one); returns the automation's id."""
    from prefect.automations import Automation, EventTrigger, Posture, SendNotification
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    block = CustomWebhookNotificationBlock(
        name="tbench regressions",
        url=webhook_url,
        json_data={"subject": "{{subject}}", "text": "{{body}}"},
    )
    block_id = block.save(WEBHOOK_BLOCK, overwrite=True)
    delete_automation(AUTOMATION)
    automation = Automation(
        name=AUTOMATION,
        description="A stored run made a series of its model regress (tbench history); notify the team's webhook.",
        trigger=EventTrigger(expect={REGRESSED_EVENT}, posture=Posture.Reactive, threshold=1),
        actions=[SendNotification(block_document_id=block_id, subject=SUBJECT, body=BODY)],
    ).create()
    return str(automation.id)


def delete_automation(name: str) -> None:
    """Every automation of that name on the server (none is fine)."""
    from prefect.automations import Automation

    while True:
        try:
            Automation.read(name=name).delete()
        except ValueError:  # Prefect's answer for a name no automation has (any more)
            return
