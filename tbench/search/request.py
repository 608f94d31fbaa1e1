"""What a configuration search is asked for (`SearchRequest`, the search flow's second parameter): pure pydantic, no
Prefect, so the CLI validates it before a run starts and the Prefect UI shows it as a form."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tbench.search.strategies import STRATEGIES, Objective, SearchSpace

# The registry's strategy names, in its order, as a Literal: the schema and the validation error list them.
StrategyName = Literal[tuple(STRATEGIES.names())]  # type: ignore[valid-type]


class SearchRequest(BaseModel):
    """What to search; the model, its formats, server and measurement settings come from the BenchmarkRequest."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a misspelt field is an error, not ignored

    space: SearchSpace = Field(
        default_factory=SearchSpace,
        description="The configuration grid; formats: [''] serves "
        "the request's first serve format, else formats or 'format:precision' variants.",
    )
    objective: Objective = Field(
        default_factory=Objective,
        description="Best throughput under a p99 budget, or lowest p99 above a throughput floor.",
    )
    strategy: StrategyName = Field(
        "smart", description="smart: coordinate search on a budget of measurements; exhaustive: every candidate."
    )
    budget_fraction: float = Field(0.10, gt=0, le=1, description="smart: the largest share of the grid measured.")
    concurrency: int | None = Field(
        None,
        ge=1,
        description="Closed-loop clients per measurement; the largest of the request's online concurrency by default.",
    )
    search_load: bool = Field(
        True,
        description="With a p99 budget, each candidate's load is searched too: its best concurrency up to "
        "`concurrency` (powers of two) whose p99 holds the budget, so the answer is a configuration at a load; "
        "false: every candidate at `concurrency`.",
    )
    confirm_rounds: int | None = Field(
        None,
        ge=0,
        le=20,
        description="Confirmation rounds at most: the leader and the configurations the windows cannot separate from "
        "it are measured again (a few per round) and selected again; 0: none; default: 6 exhaustive, 2 smart.",
    )
    resume_from: str | None = Field(
        None,
        description="Resume an interrupted search: its checkpoint (search.jsonl) or "
        "its run folder; measured candidates are read back, not measured again.",
    )

    @property
    def load_budget_ms(self) -> float | None:
        """The budget each candidate's load is searched against (search_load), or None: measured at one load."""
        searched = self.search_load and self.objective.goal == "max_throughput"
        return self.objective.p99_budget_ms if searched else None
