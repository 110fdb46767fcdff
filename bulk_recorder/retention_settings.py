"""How long the API's idempotency records and finished jobs are kept (issue 28).

They live here, at the settings' own layer, for the reason :mod:`bulk_recorder.otel_settings`
does: ``settings.py`` stays one screen of the shared settings; :class:`settings.Settings`
inherits them. ``bulk-recorder retention`` removes what is past them.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

DEFAULT_RETENTION_DAYS = 30


class RetentionSettings(BaseSettings):
    """``API_*_RETENTION_DAYS``: the windows ``bulk-recorder retention`` keeps."""

    api_idempotency_retention_days: int = Field(
        DEFAULT_RETENTION_DAYS,
        ge=1,
        le=36_500,
        description=(
            "Days a POST /v1/transactions request (its Idempotency-Key and body hash) is kept "
            "for replays; `bulk-recorder retention` removes older ones."
        ),
    )
    api_job_retention_days: int = Field(
        DEFAULT_RETENTION_DAYS,
        ge=1,
        le=36_500,
        description=(
            "Days a credit-annotation job (its key, status and repeats) is kept after it was "
            "accepted; `bulk-recorder retention` removes older completed ones, never an "
            "unfinished one."
        ),
    )
