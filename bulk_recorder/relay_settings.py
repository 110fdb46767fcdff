"""The relay's settings: how many outbox rows a claim takes, how many claims run at once, and
how often the outbox is polled when no NOTIFY comes.

They live here, at the settings' own layer, for the reason :mod:`bulk_recorder.otel_settings`
does: ``settings.py`` stays one screen of the shared settings; :class:`settings.Settings`
inherits them. ``bulk-recorder relay --batch-size/--lanes/--poll-interval`` win over them.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

# The relay's defaults, one copy: these settings' and RelayConfig's (a relay built in code).
DEFAULT_BATCH_SIZE = 500
DEFAULT_LANES = 2
DEFAULT_POLL_INTERVAL_S = 1.0


class RelaySettings(BaseSettings):
    """``RELAY_*``: the defaults of ``bulk-recorder relay``'s options."""

    relay_batch_size: int = Field(
        DEFAULT_BATCH_SIZE,
        ge=1,
        le=100_000,
        description="Outbox rows claimed, published and deleted a batch.",
    )
    relay_lanes: int = Field(
        DEFAULT_LANES,
        ge=1,
        le=64,
        description="Batches in flight at once (one database connection each).",
    )
    relay_poll_interval_s: float = Field(
        DEFAULT_POLL_INTERVAL_S,
        gt=0,
        le=3600,
        description="Seconds between outbox polls when no NOTIFY arrives.",
    )
