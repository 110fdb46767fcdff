"""Every setting of bulk-recorder, read once from the environment at the entrypoint.

Names follow Midaz where Midaz has one (``RABBITMQ_NUMBERS_OF_WORKERS`` ...). Library code never
reads the environment: the entrypoint calls :func:`load_settings` once and passes the object
down. A wrong value fails start-up with a :class:`SettingsError` that names the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, parse_qsl, urlsplit

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import SettingsConfigDict

from bulk_recorder.api_settings import ApiSettings
from bulk_recorder.exceptions import EXIT_SETTINGS, BulkRecorderError
from bulk_recorder.masking import masked
from bulk_recorder.otel_settings import NEVER_SHOWN, OtelSettings
from bulk_recorder.relay_settings import RelaySettings
from bulk_recorder.retention_settings import RetentionSettings
from bulk_recorder.shard_settings import ShardSettings
from bulk_recorder.url_checks import scheme_of, url_problem

# PostgreSQL's bind-parameter limit per statement (a 16-bit counter in the wire protocol).
PG_MAX_PARAMETERS = 65_535
# Hard cap on rows per INSERT statement, whatever the setting says.
MAX_ROWS_PER_INSERT = 1_000
# METRICS_PORT when it is not set: one port per role, so that `consume`, `relay` and `api` run
# side by side on one host with no port settings (the API serves /metrics on API_PORT).
DEFAULT_METRICS_PORTS = {"consume": 9464, "relay": 9465}


class SettingsError(BulkRecorderError, ValueError):
    """A setting is missing or malformed; the message names the environment variable."""

    exit_code = EXIT_SETTINGS


class Settings(ApiSettings, RelaySettings, RetentionSettings, ShardSettings, OtelSettings):
    """Typed view of the environment: field ``foo_bar`` is ``FOO_BAR`` (``OTEL_*``: the base)."""

    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True)

    database_url: str = Field(
        "postgresql://postgres@127.0.0.1:5432/bulk_recorder",
        description=(
            "PostgreSQL DSN; `migrate` creates the database if missing. Several hosts "
            "(`host1:5432,host2:5432`) with `target_session_attrs=read-write` follow the "
            "primary; each host gets `connect_timeout` seconds (default 5) before the next."
        ),
    )
    rabbitmq_url: str = Field(
        "amqp://guest:guest@127.0.0.1:5672/",
        description=(
            "Broker URL, or a comma-separated list of URLs, one per cluster node: a command "
            "connects to one (starting at a random one) and moves to the next when it is lost."
        ),
    )
    rabbitmq_exchange: str = Field(
        "bulk_recorder", min_length=1, max_length=200, description="Topic exchange producers use."
    )
    rabbitmq_queue: str = Field(
        "bulk_recorder.records",
        min_length=1,
        max_length=200,
        description="Quorum queue consumed; its dead-letter queue is `<queue>.dlq`.",
    )
    rabbitmq_delivery_limit: int = Field(
        5, ge=1, le=1000, description="Deliveries before the broker dead-letters a message."
    )
    rabbitmq_numbers_of_workers: int = Field(
        5, ge=1, le=256, description="Concurrent flush workers (one DB connection each)."
    )
    rabbitmq_numbers_of_prefetch: int = Field(10, ge=1, le=10_000, description="Prefetch a worker.")
    rabbitmq_transaction_async: bool = Field(
        True, description="Async path (outbox, queue, recorder); false: the API writes directly."
    )
    bulk_recorder_enabled: bool = Field(
        True, description="Bulk mode; false: one message, one transaction, one ack."
    )
    bulk_recorder_size: int = Field(
        0, ge=0, le=100_000, description="Flush size; 0 means workers x prefetch."
    )
    bulk_recorder_flush_timeout_ms: int = Field(
        100,
        ge=1,
        le=600_000,
        description="Flush a partial batch this long after its first message.",
    )
    bulk_recorder_max_rows_per_insert: int = Field(
        MAX_ROWS_PER_INSERT,
        ge=1,
        le=MAX_ROWS_PER_INSERT,
        description="Rows per INSERT; also capped by 65,535 / columns.",
    )
    bulk_recorder_max_message_bytes: int = Field(
        1_048_576, ge=1024, le=128 * 1_048_576, description="Larger bodies are dead-lettered."
    )
    bulk_recorder_release_after_s: float = Field(
        60.0,
        gt=0,
        le=1_500,
        description=(
            "During a database outage, or while the dead-letter queue refuses a message, held "
            "deliveries are released after this long (a copy republished to the queue, then the "
            "delivery acked, so no delivery is spent); must stay well under the broker's "
            "consumer timeout (30 min by default)."
        ),
    )
    bulk_recorder_confirm_timeout_s: float = Field(
        15.0,
        gt=0,
        le=600,
        description=(
            "How long the recorder waits for the broker to route and confirm a message it "
            "publishes (a dead letter, a released delivery); past it the publish counts as "
            "failed and is retried."
        ),
    )
    bulk_recorder_shutdown_timeout_s: float = Field(
        30.0, gt=0, le=600, description="First step of a stop: final flush, batches, requests."
    )
    bulk_recorder_db_command_timeout_s: float = Field(
        15.0,
        gt=0,
        le=3_600,
        description=(
            "A database command unanswered for this long fails on the client (asyncpg's "
            "command_timeout) and the flush is retried as an outage: how soon a held "
            "(partitioned) database connection is noticed."
        ),
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65_535,
        description=(
            "/metrics, /healthz and /readyz port; 0 disables. Unset: the role's own default "
            "(`consume` 9464, `relay` 9465), so every process runs on one host with defaults; "
            "the API serves /metrics on API_PORT."
        ),
    )
    metrics_host: str = Field(
        "127.0.0.1",
        min_length=1,
        description="Where /metrics, /healthz and /readyz listen (0.0.0.0 in the container).",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    log_format: Literal["text", "json"] = "text"

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("database_url")
    @classmethod
    def _postgres_scheme(cls, value: str) -> str:
        if not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL")
        problem = url_problem(value, strict_query=True) or _tls_files_problem(
            value, ("sslrootcert", "sslcert", "sslkey", "sslcrl")
        )
        if problem:
            raise ValueError(problem)
        hostspec = urlsplit(value).netloc.rpartition("@")[2]
        if "," in hostspec and any(not h.strip() for h in hostspec.split(",")):
            raise ValueError("has an empty entry in its host list")
        for key, seconds in parse_qsl(urlsplit(value).query, keep_blank_values=True):
            if key == "connect_timeout" and not _positive_seconds(seconds):
                raise ValueError(
                    f"connect_timeout (seconds, per host) must be > 0 and <= 3600, not {seconds!r}"
                )
        return value

    @field_validator("rabbitmq_url")
    @classmethod
    def _amqp_urls(cls, value: str) -> str:
        urls = [part.strip() for part in value.split(",")]
        for number, url in enumerate(urls, start=1):
            where = f"entry {number} of {len(urls)}" if len(urls) > 1 else "the URL"
            problem = _amqp_url_problem(url)
            if problem:
                raise ValueError(
                    f"must be an amqp:// or amqps:// URL, or a comma-separated list of them, one "
                    f"per cluster node; {where} {problem}"
                )
            files = _tls_files_problem(url, ("cafile", "capath", "certfile", "keyfile"))
            if files:
                raise ValueError(f"{where}: {files}")
        return ",".join(urls)

    # -- derived values ----------------------------------------------------------------------

    def for_role(self, role: str) -> Settings:
        """These settings with METRICS_PORT resolved to ``role``'s default when it is unset."""
        if self.metrics_port is not None:
            return self
        return self.model_copy(update={"metrics_port": DEFAULT_METRICS_PORTS.get(role, 0)})

    @property
    def bulk_mode_active(self) -> bool:
        """Bulk mode needs both the async path and the bulk toggle."""
        return self.rabbitmq_transaction_async and self.bulk_recorder_enabled

    @property
    def bulk_mode_reason(self) -> str:
        if not self.rabbitmq_transaction_async:
            return "RABBITMQ_TRANSACTION_ASYNC=false"
        if not self.bulk_recorder_enabled:
            return "BULK_RECORDER_ENABLED=false"
        return "enabled"

    @property
    def effective_batch_size(self) -> int:
        """Flush size: the setting, or workers x prefetch when it is 0; 1 in per-message mode."""
        if not self.bulk_mode_active:
            return 1
        if self.bulk_recorder_size:
            return self.bulk_recorder_size
        return self.rabbitmq_numbers_of_workers * self.rabbitmq_numbers_of_prefetch

    @property
    def channel_prefetch(self) -> int:
        """Broker QoS for the consumer channel.

        Workers x prefetch, raised to one batch per flush worker plus one filling: with a
        prefetch equal to the batch size every delivery is unacked while a batch is written and
        delivery stalls, and with room for only two batches at most one flush waits on the
        database while the next fills, whatever the number of workers. Sized to the workers, a
        database a network hop away is hidden (benchmarks/RESULTS.md, section 10: at a 2 ms round
        trip 2,217 against 1,285 transactions/s, same run).
        """
        base = self.rabbitmq_numbers_of_workers * self.rabbitmq_numbers_of_prefetch
        batches = (self.rabbitmq_numbers_of_workers + 1) * self.effective_batch_size
        return min(max(base, batches), 65_535)

    @property
    def flush_timeout_s(self) -> float:
        return self.bulk_recorder_flush_timeout_ms / 1000.0

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.rabbitmq_exchange}.dlx"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.rabbitmq_queue}.dlq"


def _positive_seconds(text: str) -> bool:
    try:
        seconds = float(text)
    except ValueError:
        return False
    return 0 < seconds <= 3600


def _amqp_url_problem(url: str) -> str:
    """Why ``url`` is not a usable AMQP URL ("" when it is). Never echoes a password."""
    if not url:
        return "is empty"
    if not url.startswith(("amqp://", "amqps://")):
        scheme = scheme_of(url)  # only a scheme: without one, what leads may be a password
        return (
            f"does not start with amqp:// or amqps:// ({scheme!r})" if scheme else "has no scheme"
        )
    if url.count("://") > 1:
        return "holds more than one URL (separate the nodes with commas)"
    problem = url_problem(url, strict_query=False)
    if problem:
        return problem
    parts = urlsplit(url)
    if not parts.hostname:
        return "has no host"
    if parts.port == 0:
        return "has port 0"
    return ""


def _tls_files_problem(url: str, parameters: tuple[str, ...]) -> str:
    """Why a certificate or key file named in ``url``'s query cannot be used ("" if all can).

    The drivers open these files at connect time; a missing one is a bad setting, found here.
    """
    query = parse_qs(urlsplit(url).query)
    for name in parameters:
        for path in query.get(name, []):
            if name == "sslrootcert" and path == "system":  # libpq: the system's CAs
                continue
            wanted = os.path.isdir if name == "capath" else os.path.isfile
            if not wanted(path) or not os.access(path, os.R_OK):
                return f"{name}={path} is not a readable {'folder' if name == 'capath' else 'file'}"
    return ""


# Settings that may come from a file named by <NAME>_FILE instead (the Docker and Kubernetes
# secrets convention), so that a password never sits in the environment.
SECRET_FILE_SETTINGS = ("database_url", "rabbitmq_url")


def _from_files(environ: Mapping[str, str]) -> dict[str, str]:
    """The settings given as ``<NAME>_FILE``: each file read once, surrounding white space (the
    trailing newline an editor or ``echo`` leaves) dropped."""
    found: dict[str, str] = {}
    for field in SECRET_FILE_SETTINGS:
        name = field.upper()
        path = environ.get(name + "_FILE")
        if path is None:
            continue
        if name in environ:
            raise SettingsError(f"invalid settings: {name} and {name}_FILE are both set; set one")
        try:
            value = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise SettingsError(
                f"invalid settings: {name}_FILE: cannot read {path!r} ({reason})"
            ) from None
        if any(ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0 for char in value):
            # NULs between the letters: UTF-16 without its BOM; never echoed (nor its letters)
            raise SettingsError(
                f"invalid settings: {name}_FILE: {path!r} holds control characters (not one "
                "line of UTF-8 text: UTF-16?)"
            )
        if not value:
            raise SettingsError(f"invalid settings: {name}_FILE: {path!r} is empty")
        found[field] = value
    return found


def _shown(field: str, value: object) -> bool:
    """Whether a bad value is echoed: not a secret, nor a URL setting's without ``scheme://``
    (for each node of a list), whose password masking could not tell from a host."""
    if isinstance(value, dict) or field in NEVER_SHOWN:
        return False
    if field in SECRET_FILE_SETTINGS and isinstance(value, str):
        urls = value.split(",") if field == "rabbitmq_url" else [value]
        return all(scheme_of(url.strip()) for url in urls if url.strip())
    return True


def load_settings(**overrides: object) -> Settings:
    """Build the settings from the environment (plus explicit overrides); DATABASE_URL and
    RABBITMQ_URL may come from the files named by DATABASE_URL_FILE and RABBITMQ_URL_FILE.

    Raises :class:`SettingsError` naming every offending variable, its value and what is expected.
    """
    from_files = _from_files(os.environ)
    try:
        return Settings(**{**from_files, **overrides})  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"]).lower()
            name = field.upper() or "SETTINGS"
            if field in from_files:
                name += "_FILE"
            value = error.get("input")
            shown = f" (got {value!r})" if _shown(field, value) else ""
            problems.append(masked(f"{name}: {error['msg']}{shown}"))
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None
