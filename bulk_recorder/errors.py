"""How a database failure is classified: the data's fault, or an outage.

The distinction decides everything downstream. Data errors isolate the offending row (split the
batch, reject only that row's delivery). Everything else is treated as an outage: no delivery is
rejected and nothing is dead-lettered; the flush is retried until the database is back. Unknown
errors count as outages on purpose: dead-lettering good data for a bug or an outage is the one
thing the service must never do.
"""

from __future__ import annotations

import asyncpg

# SQLSTATE classes that mean "this row is wrong": data exception, integrity constraint violation,
# program limit exceeded (e.g. a value too large for an index row).
_DATA_CLASSES = ("22", "23", "54")


class DataRejected(Exception):
    """PostgreSQL refused the rows themselves; retrying the same rows cannot succeed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TransientDbError(Exception):
    """The database is unreachable or the transaction failed for a cause that can pass."""


def classify(exc: BaseException) -> DataRejected | TransientDbError:
    """Map a driver exception to :class:`DataRejected` or :class:`TransientDbError`."""
    if isinstance(exc, asyncpg.PostgresError):
        sqlstate = getattr(exc, "sqlstate", None) or ""
        if sqlstate[:2] in _DATA_CLASSES:
            detail = getattr(exc, "detail", None)
            text = f"{sqlstate} {exc}" + (f" ({detail})" if detail else "")
            return DataRejected(text[:300])
    return TransientDbError(f"{type(exc).__name__}: {exc}"[:300])
