"""The ingest API's settings (``API_*``): where it listens, how large and how slow a job upload
may be, how many processes validate a job's lines, and whether ``/v1`` needs a key.

They live here, at the settings' own layer, for the reason :mod:`bulk_recorder.otel_settings`
does: ``settings.py`` stays one screen of the shared settings; :class:`settings.Settings`
inherits them. ``API_IDEMPOTENCY_RETENTION_DAYS`` and ``API_JOB_RETENTION_DAYS`` are the
retention command's (:mod:`bulk_recorder.retention_settings`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings


class ApiSettings(BaseSettings):
    """``API_*``: ``bulk-recorder api``."""

    api_host: str = Field(
        "127.0.0.1", min_length=1, description="Where `bulk-recorder api` listens."
    )
    api_port: int = Field(8080, ge=1, le=65_535, description="API port.")
    api_root_path: str = Field(
        "",
        pattern=r"^(/[A-Za-z0-9._~-]+)*$",
        description=(
            "The path prefix a reverse proxy serves the API under and strips (`/bulk`): "
            "`/docs` and `/redoc` then load `/bulk/openapi.json` and their assets from there, "
            "and the document's `servers` says it. Empty: served at the root."
        ),
    )
    api_max_job_bytes: int = Field(
        256 * 1_048_576,
        ge=1024,
        le=16 * 1024 * 1_048_576,
        description=(
            "Largest credit-annotation job body; larger is 413, from Content-Length before "
            "reading or as soon as the streamed body passes it (~1M NDJSON lines fit the default)."
        ),
    )
    api_body_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description=(
            "Longest wait for the next part of a request body; a client that sends nothing "
            "for this long gets 408 and its job slot and database connection are freed."
        ),
    )
    api_upload_timeout_s: float = Field(
        600.0,
        gt=0,
        le=86_400,
        description=(
            "A request body must be complete within this long (408 otherwise), so that a "
            "client trickling bytes cannot hold a job slot for ever."
        ),
    )
    api_job_stall_after_s: float = Field(
        60.0,
        gt=0,
        le=86_400,
        description=(
            "A job whose outbox rows wait and of which nothing has been published for this "
            "long (no relay running, or it cannot reach the broker) shows status `stalled`."
        ),
    )
    api_job_workers: int = Field(
        2,
        ge=0,
        le=64,
        description=(
            "Processes that validate a job's lines beside the API's event loop (started with "
            "the first job upload, stopped with the API); 0: on the event loop itself. About "
            "the host's cores: the relay and the recorder are idle until a job is accepted."
        ),
    )
    api_auth: Literal["on", "off"] = Field(
        "on",
        description=(
            "on: every /v1 request needs an API key (Authorization: Bearer <key>, made with "
            "`bulk-recorder api-key create`); off: anyone reaching API_PORT may call /v1, for "
            "local demos only."
        ),
    )

    @field_validator("api_auth", mode="before")
    @classmethod
    def _api_auth_lower(cls, value: object) -> object:
        # its own name: a validator named like the settings class's ``_lower`` is replaced by it
        return value.strip().lower() if isinstance(value, str) else value
