"""The OpenTelemetry settings: the standard ``OTEL_*`` variables, as fields of the settings.

They live here, at the settings' own layer, so that ``settings.py`` stays one screen of the
service's own settings; :class:`settings.Settings` inherits them. Each field is the variable of
the same name (OpenTelemetry's SDK environment specification), read once at the entrypoint like
every other setting: the tracer provider is built from these values
(:mod:`bulk_recorder.infra.tracing`), never from the environment. A bad value fails start-up
naming the variable.
"""

from __future__ import annotations

import os
import re
from typing import Literal, NamedTuple
from urllib.parse import unquote, urlsplit

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings

Sampler = Literal[
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
]

# The one OTLP protocol the installed exporter (opentelemetry-exporter-otlp-proto-http) speaks.
PROTOCOL = "http/protobuf"
COMPRESSIONS = ("none", "gzip", "deflate")
# The exporter's wait for one export, unless OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT says (ms).
DEFAULT_EXPORT_TIMEOUT_MS = 10_000
# Settings whose value a refusal never shows: headers carry tokens (Authorization=Bearer ...).
NEVER_SHOWN = ("otel_exporter_otlp_headers", "otel_exporter_otlp_traces_headers")
# An HTTP header name (RFC 9110 token).
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _names(value: str) -> list[str]:
    """A comma-separated list of names, lower-cased, blanks dropped."""
    return [name.strip().lower() for name in value.split(",") if name.strip()]


class OtelSettings(BaseSettings):
    """Tracing is on when an OTLP endpoint is set and ``OTEL_SDK_DISABLED`` is not true."""

    otel_sdk_disabled: bool = Field(
        False, description="true: no tracing at all, whatever else is set."
    )
    otel_exporter_otlp_endpoint: str | None = Field(
        None,
        description=(
            "OTLP/HTTP base URL (e.g. `http://collector:4318`); spans go to `<it>/v1/traces`. "
            "Unset (and no traces endpoint): tracing is off and costs nothing."
        ),
    )
    otel_exporter_otlp_traces_endpoint: str | None = Field(
        None,
        description="The full OTLP/HTTP traces URL, used as is; wins over the base endpoint.",
    )
    otel_service_name: str | None = Field(
        None,
        min_length=1,
        description="`service.name` of the spans; unset: `bulk-recorder-<command>`.",
    )
    otel_traces_sampler: Sampler = Field(
        "parentbased_always_on",
        description=(
            "Which spans are kept: `parentbased_traceidratio` keeps a caller's decision and "
            "OTEL_TRACES_SAMPLER_ARG of the traces that start here."
        ),
    )
    otel_traces_sampler_arg: float | None = Field(
        None, ge=0, le=1, description="The ratio of the `*traceidratio` samplers (default 1.0)."
    )
    otel_resource_attributes: str = Field(
        "",
        description="More resource attributes, `key=value,key2=value2` (values percent-encoded).",
    )

    otel_exporter_otlp_protocol: str = Field(
        PROTOCOL,
        description="`http/protobuf` only (the installed exporter); `grpc`, `http/json`: exit 2.",
    )
    otel_exporter_otlp_traces_protocol: str | None = Field(
        None, description="The traces' own protocol; as OTEL_EXPORTER_OTLP_PROTOCOL."
    )
    otel_traces_exporter: str = Field(
        "otlp", description="`otlp`, or `none` (tracing off); any other exporter: exit 2."
    )
    otel_propagators: str = Field(
        "tracecontext",
        description="`tracecontext` (W3C), the only one carried; any other (`baggage`): exit 2.",
    )

    # The exporter's own variables, each with its _TRACES_ form (which wins), read here like
    # every setting and handed to the exporter: a bad one is exit 2, not a warning at export.
    otel_exporter_otlp_headers: str | None = Field(
        None, description="Headers of each export, `name=value,name2=value2` (percent-encoded)."
    )
    otel_exporter_otlp_traces_headers: str | None = Field(
        None, description="The traces' own headers; wins over OTEL_EXPORTER_OTLP_HEADERS."
    )
    otel_exporter_otlp_compression: str | None = Field(
        None, description="`none` (default), `gzip` or `deflate`."
    )
    otel_exporter_otlp_traces_compression: str | None = Field(
        None, description="The traces' own; as OTEL_EXPORTER_OTLP_COMPRESSION."
    )
    otel_exporter_otlp_timeout: int | None = Field(
        None, ge=1, le=600_000, description="Milliseconds an export may take (default 10000)."
    )
    otel_exporter_otlp_traces_timeout: int | None = Field(
        None, ge=1, le=600_000, description="The traces' own; as OTEL_EXPORTER_OTLP_TIMEOUT."
    )
    otel_exporter_otlp_certificate: str | None = Field(
        None, description="CA certificate file (PEM) to verify an https:// collector."
    )
    otel_exporter_otlp_traces_certificate: str | None = Field(None, description="The traces' own.")
    otel_exporter_otlp_client_key: str | None = Field(
        None, description="Client private key file (PEM), for mutual TLS."
    )
    otel_exporter_otlp_traces_client_key: str | None = Field(None, description="The traces' own.")
    otel_exporter_otlp_client_certificate: str | None = Field(
        None, description="Client certificate file (PEM), for mutual TLS."
    )
    otel_exporter_otlp_traces_client_certificate: str | None = Field(
        None, description="The traces' own."
    )
    # The batch span processor's, in milliseconds and spans (OpenTelemetry's OTEL_BSP_*).
    otel_bsp_schedule_delay: int = Field(
        2000, ge=1, le=600_000, description="Milliseconds between two exports."
    )
    otel_bsp_export_timeout: int = Field(
        30_000, ge=1, le=600_000, description="Milliseconds one export may take in all."
    )
    otel_bsp_max_queue_size: int = Field(
        8192, ge=1, le=1_000_000, description="Spans waiting; past it new ones are dropped."
    )
    otel_bsp_max_export_batch_size: int = Field(
        512, ge=1, le=1_000_000, description="Spans an export; at most OTEL_BSP_MAX_QUEUE_SIZE."
    )

    @field_validator("otel_exporter_otlp_headers", "otel_exporter_otlp_traces_headers")
    @classmethod
    def _headers(cls, value: str | None) -> str | None:
        if value is not None:
            otlp_headers(value)  # raises ValueError naming the bad entry, never its value
        return value

    @field_validator("otel_exporter_otlp_compression", "otel_exporter_otlp_traces_compression")
    @classmethod
    def _compression(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip().lower()
        if value not in COMPRESSIONS:
            raise ValueError(f"must be one of {', '.join(COMPRESSIONS)}")
        return value

    @field_validator(
        "otel_exporter_otlp_certificate",
        "otel_exporter_otlp_traces_certificate",
        "otel_exporter_otlp_client_key",
        "otel_exporter_otlp_traces_client_key",
        "otel_exporter_otlp_client_certificate",
        "otel_exporter_otlp_traces_client_certificate",
    )
    @classmethod
    def _readable_file(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        if not os.path.isfile(value) or not os.access(value, os.R_OK):
            raise ValueError(f"{value} is not a readable file")
        return value

    @field_validator("otel_bsp_max_export_batch_size")
    @classmethod
    def _batch_within_queue(cls, value: int, info: ValidationInfo) -> int:
        queue = info.data.get("otel_bsp_max_queue_size")
        if isinstance(queue, int) and value > queue:
            raise ValueError(f"must be at most OTEL_BSP_MAX_QUEUE_SIZE ({queue})")
        return value

    @field_validator("otel_exporter_otlp_protocol", "otel_exporter_otlp_traces_protocol")
    @classmethod
    def _protocol(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None if value is None else PROTOCOL
        value = value.strip().lower()
        if value != PROTOCOL:
            raise ValueError(
                f"{value!r} is not supported: spans are sent with the installed OTLP/HTTP "
                f"exporter, protocol {PROTOCOL!r} (point the endpoint at the collector's "
                "HTTP port, 4318)"
            )
        return value

    @field_validator("otel_traces_exporter")
    @classmethod
    def _exporter(cls, value: str) -> str:
        names = _names(value) or ["otlp"]
        if names not in (["otlp"], ["none"]):
            raise ValueError("must be 'otlp' or 'none': no other exporter is installed")
        return names[0]

    @field_validator("otel_propagators")
    @classmethod
    def _propagators(cls, value: str) -> str:
        names = _names(value) or ["tracecontext"]
        if names != ["tracecontext"]:
            unknown = ", ".join(repr(n) for n in names if n != "tracecontext")
            raise ValueError(
                f"{unknown} not supported: only 'tracecontext' (W3C traceparent) is carried"
            )
        return "tracecontext"

    @field_validator("otel_traces_sampler", mode="before")
    @classmethod
    def _sampler_lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("otel_exporter_otlp_endpoint", "otel_exporter_otlp_traces_endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip()
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host (OTLP over HTTP)")
        return value

    @field_validator("otel_resource_attributes")
    @classmethod
    def _attributes(cls, value: str) -> str:
        resource_attributes(value)  # raises ValueError naming the bad entry
        return value

    @property
    def otel_traces_url(self) -> str | None:
        """Where spans are sent, or None when tracing is off."""
        if self.otel_sdk_disabled or self.otel_traces_exporter == "none":
            return None
        if self.otel_exporter_otlp_traces_endpoint:
            return self.otel_exporter_otlp_traces_endpoint
        if self.otel_exporter_otlp_endpoint:
            return self.otel_exporter_otlp_endpoint.rstrip("/") + "/v1/traces"
        return None


class OtlpOptions(NamedTuple):
    """What the OTLP/HTTP exporter is built with: each the _TRACES_ form, else the general one."""

    headers: dict[str, str]
    compression: str
    timeout_s: float
    certificate: str | None
    client_key: str | None
    client_certificate: str | None


def otlp_options(settings: OtelSettings) -> OtlpOptions:
    s = settings
    headers = s.otel_exporter_otlp_traces_headers or s.otel_exporter_otlp_headers or ""
    timeout = s.otel_exporter_otlp_traces_timeout or s.otel_exporter_otlp_timeout
    compression = s.otel_exporter_otlp_traces_compression or s.otel_exporter_otlp_compression
    return OtlpOptions(
        headers=otlp_headers(headers),
        compression=compression or "none",
        timeout_s=(timeout or DEFAULT_EXPORT_TIMEOUT_MS) / 1000,
        certificate=s.otel_exporter_otlp_traces_certificate or s.otel_exporter_otlp_certificate,
        client_key=s.otel_exporter_otlp_traces_client_key or s.otel_exporter_otlp_client_key,
        client_certificate=(
            s.otel_exporter_otlp_traces_client_certificate
            or s.otel_exporter_otlp_client_certificate
        ),
    )


def otlp_headers(text: str) -> dict[str, str]:
    """``OTEL_EXPORTER_OTLP_HEADERS``: ``name=value`` pairs separated by commas, percent-decoded,
    names lower-cased. A refusal names the entry by its number, never its value."""
    found: dict[str, str] = {}
    for number, entry in enumerate(text.split(","), start=1):
        if not entry.strip():
            continue
        key, sep, value = entry.partition("=")
        name = unquote(key.strip())
        if not sep or not _TOKEN.match(name):
            raise ValueError(f"entry {number} is not name=value with an HTTP header name")
        if _CONTROL.search(unquote(value.strip())):
            raise ValueError(f"entry {number} ({name}): its value holds a control character")
        found[name.lower()] = unquote(value.strip())
    return found


def resource_attributes(text: str) -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES``: ``key=value`` pairs separated by commas, percent-decoded."""
    found: dict[str, str] = {}
    for entry in text.split(","):
        if not entry.strip():
            continue
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"entry {entry.strip()!r} is not key=value")
        found[unquote(key.strip())] = unquote(value.strip())
    return found
