"""What ``GET /v1/credit-annotation-jobs/{id}`` answers: a job's progress, and whether it stalled.

A job's lines all enter the outbox in the one database transaction that stores the job, and
each leaves it either published (the relay deletes the row and adds one to the job's
``published``, in the same transaction) or parked (``dead_lettered``). So the rows still unsent
are ``accepted - published - dead_lettered``, exactly, without scanning the outbox, and the
oldest of them is as old as the job. Ages are measured by PostgreSQL's clock, the one that
stamped the rows, so a skewed API host cannot make a job look stalled.

A job is ``stalled`` while rows are unsent and, for ``API_JOB_STALL_AFTER_S``, the relays have
published none of its rows (counted from its last publish, or from its acceptance) and no row
at all, a transaction or another job's line (``outbox_relay_activity``): no relay runs, or none
can reach the broker. The second condition keeps a job that waits its turn behind other rows
(the relay claims rows in outbox order) from reading ``stalled`` while the relay is busy with
them. It goes back to ``publishing`` as soon as a relay publishes a row again.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = ["COMPLETE_JOB", "JOB_BY_ID", "RECORDED", "JobState", "JobStatus", "job_status"]

JobState = Literal["publishing", "stalled", "recording", "completed"]

# The job row, with its age, the time since the relay last published one of its rows, and the
# time since it last published any row (006_outbox_relay_activity.sql; the jobs' latest, an
# index scan, also counts: see 004_job_last_published.sql).
# A job's recorded lines: its own rows, plus its lines whose id was already stored (under another
# job or none), which the recorder lists in credit_annotation_job_repeats.
RECORDED = """
SELECT (SELECT count(*) FROM credit_annotations WHERE job_id = $1)
     + (SELECT count(*) FROM credit_annotation_job_repeats WHERE job_id = $1)
"""
# Complete once every line is recorded (or parked) AND the relay's count of its published rows
# is in: the recorder may commit a line before the relay commits the delete that counts it
# (after the broker's confirm), and a job frozen as completed then would show rows unsent.
COMPLETE_JOB = """
UPDATE credit_annotation_jobs SET recorded = $2, completed_at = clock_timestamp()
WHERE id = $1 AND completed_at IS NULL AND published + dead_lettered >= accepted
RETURNING completed_at
"""
JOB_BY_ID = """
SELECT *,
       extract(epoch FROM clock_timestamp() - created_at)::float8 AS age_s,
       extract(epoch FROM clock_timestamp() - coalesce(last_published_at, created_at))::float8
           AS quiet_s,
       extract(epoch FROM clock_timestamp()
                          - greatest((SELECT last_published_at FROM outbox_relay_activity),
                                     (SELECT max(last_published_at) FROM credit_annotation_jobs))
               )::float8 AS relay_quiet_s
FROM credit_annotation_jobs WHERE id = $1
"""


class JobStatus(BaseModel):
    id: str
    status: JobState = Field(
        description="publishing: rows still in the outbox, the relay publishing them; stalled: "
        "rows still in the outbox and nothing published for API_JOB_STALL_AFTER_S, neither "
        "the job's rows nor any other outbox row (no relay runs, or it cannot publish); "
        "recording: all "
        "published, not all recorded yet; completed: recorded + dead_lettered == accepted and "
        "the relay has counted every row published or parked."
    )
    accepted: int
    rejected: int
    published: int = Field(description="Outbox rows the relay published and confirmed.")
    unsent: int = Field(
        description="The job's outbox rows still waiting to be published (accepted - published "
        "- dead_lettered)."
    )
    oldest_unsent_age_s: float | None = Field(
        description="Seconds the oldest unsent row has waited in the outbox (all of a job's "
        "rows enter it together, when the job is accepted); null when none is unsent."
    )
    last_published_at: datetime | None = Field(
        description="When the relay last published one of the job's rows; null before the first."
    )
    recorded: int = Field(
        description="Lines recorded: credit_annotations rows carrying this job's id, plus the "
        "job's lines whose id was already recorded by another job (that row keeps its job id)."
    )
    dead_lettered: int = Field(
        description="Outbox rows the relay parked after the broker refused them repeatedly. "
        "Messages the recorder dead-letters are not counted here (see the DLQ)."
    )
    progress: float = Field(description="(recorded + dead_lettered) / accepted, 0 to 1.")
    created_at: datetime
    completed_at: datetime | None


def job_status(
    row: Any,
    *,
    recorded: int,
    completed_at: datetime | None,
    stall_after_s: float,
) -> JobStatus:
    """The status of the job in ``row`` (a :data:`JOB_BY_ID` row, or a mapping like it)."""
    accepted, published = int(row["accepted"]), int(row["published"])
    dead = int(row["dead_lettered"])
    unsent = max(0, accepted - published - dead)
    state: JobState
    if completed_at is not None:
        state = "completed"
    elif unsent == 0:
        state = "recording"
    elif float(row["quiet_s"]) >= stall_after_s and _relay_quiet(row, stall_after_s):
        state = "stalled"
    else:
        state = "publishing"
    return JobStatus(
        id=str(row["id"]),
        status=state,
        accepted=accepted,
        rejected=int(row["rejected"]),
        published=published,
        unsent=unsent,
        oldest_unsent_age_s=round(max(0.0, float(row["age_s"])), 3) if unsent else None,
        last_published_at=row["last_published_at"],
        recorded=recorded,
        dead_lettered=dead,
        progress=min(1.0, (recorded + dead) / accepted) if accepted else 1.0,
        created_at=row["created_at"],
        completed_at=completed_at,
    )


def _relay_quiet(row: Any, stall_after_s: float) -> bool:
    """No outbox row was published for ``stall_after_s`` (or none ever was)."""
    quiet = row["relay_quiet_s"]
    return quiet is None or float(quiet) >= stall_after_s
