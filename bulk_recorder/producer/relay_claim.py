"""Which outbox rows a relay lane takes next: the claim, and where it starts looking.

Every published row is deleted, so the front of the outbox's pending index is a trail of
deleted rows: until VACUUM removes them (and, while a long transaction holds back the xmin
horizon, VACUUM cannot), a claim that looks for the first available row from the start of the
index reads every one of them. After a few million rows, or a long transaction held across
them, each claim read thousands of pages (benchmarks/RESULTS.md, "The outbox under churn").

So a relay remembers where its last claim started (:class:`ClaimCursor`) and the next claim
looks from there: it passes only the rows deleted since. A row can appear below that point
later: a row whose transaction committed after rows with higher ids (a 300,000-line job's
transaction runs for seconds while single requests commit behind it), a row refused for now
whose retry time has come, or one ``outbox unpark`` put back. A rescan from the start finds
them: at most every ``RESCAN_EVERY_S`` seconds, or ``RESCAN_COST_FACTOR`` times as long as
the last rescan took, whichever is longer (so rescans never take more than a tenth of a lane's
time, even while a long transaction keeps dead rows in their way).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import asyncpg

from bulk_recorder.infra.db import Connection

CLAIM_WINDOW = 4  # ids a claim looks at: this many batches for every lane
RESCAN_EVERY_S = 1.0  # the least time between two rescans from the start of the outbox
RESCAN_COST_FACTOR = 10  # ... and at least this many times as long as the last one took

# From the first available row at or after $3 (the cursor), a window of ids: the rows a claim
# reads stay within the window whatever plan PostgreSQL picks (the bounds are InitPlan
# parameters, usable as index conditions). A claim planned while the outbox was empty, with no
# statistics (autovacuum may not have run an ANALYZE), read and sorted every pending row each
# time: a 300,000-row job was relayed at 1,500 rows/s (benchmarks/RESULTS.md, section 10).
# The first row is found by walking the pending index from the cursor, past the rows refused for
# now (few) and the rows deleted since the last claim; ``start`` is where the window began.
CLAIM = """
WITH first AS MATERIALIZED (
    SELECT id FROM outbox
    WHERE parked_at IS NULL AND available_at <= now() AND id >= $3
    ORDER BY id
    LIMIT 1
)
SELECT id, record_type, job_id, body, attempts, traceparent, tracestate,
       (SELECT id FROM first) AS start
FROM outbox
WHERE parked_at IS NULL AND available_at <= now()
  AND id >= (SELECT id FROM first)
  AND id < (SELECT id FROM first) + $2
ORDER BY id
LIMIT $1
FOR UPDATE SKIP LOCKED
"""

# In the claim's transaction, before it: index scans only. Statistics taken while the outbox was
# empty (autovacuum analyzes it between jobs) make a scan of every pending row look as cheap as
# the walk to the first one: the first row was then found by a bitmap or sequential scan of the
# whole next job, 15,000 pages a claim (benchmarks/RESULTS.md, "The outbox under churn").
# Only for the claim: the settlement's statements that follow it plan as usual (with
# sequential scans off, the relay-activity stamp walked its row's dead versions: 100-400 ms).
INDEX_SCANS_ONLY = "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off"
EVERY_SCAN = "SET LOCAL enable_seqscan = DEFAULT; SET LOCAL enable_bitmapscan = DEFAULT"


class ClaimCursor:
    """Where a relay's next claim starts, shared by its lanes.

    ``floor`` only moves forward to where a claim found its first row, and only when no other
    claim moved it meanwhile; a rescan (a claim from 0) sets it to what it found, which may be
    lower. Lowering it is always safe (a claim then passes more deleted rows); raising it past a
    pending row is what a rescan makes good.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.floor = 0
        self._clock = clock
        self._rescan_due = clock()  # a relay starts with a rescan

    def begin(self) -> int:
        """The id a claim starts from now: 0 when a rescan is due, else ``floor``."""
        now = self._clock()
        if now < self._rescan_due:
            return self.floor
        self._rescan_due = now + RESCAN_EVERY_S  # one lane rescans; the others go on
        return 0

    def end(self, began_at: int, start: int | None, took_s: float) -> None:
        """A claim from ``began_at`` found its first available row at ``start`` (None: none)."""
        if began_at == 0:
            self._rescan_due = self._clock() + max(RESCAN_EVERY_S, RESCAN_COST_FACTOR * took_s)
            if start is not None:
                self.floor = start
        elif start is not None and self.floor == began_at:
            self.floor = start


async def claim(
    conn: Connection, cursor: ClaimCursor, batch_size: int, window: int
) -> Sequence[asyncpg.Record]:
    """Claim up to ``batch_size`` rows in ``conn``'s open transaction, from ``cursor``."""
    await conn.execute(INDEX_SCANS_ONLY)
    began_at = cursor.begin()
    started = time.monotonic()
    rows: Sequence[asyncpg.Record] = await conn.fetch(CLAIM, batch_size, window, began_at)
    await conn.execute(EVERY_SCAN)
    cursor.end(began_at, rows[0]["start"] if rows else None, time.monotonic() - started)
    return rows
