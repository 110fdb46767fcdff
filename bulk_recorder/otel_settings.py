"""The OpenTelemetry settings: the standard ``OTEL_*`` variables, as fields of the settings.

They live here, at the settings' own layer, so that ``settings.py`` stays one screen of the
service's own settings; :class:`settings.Settings` inherits them. Each field is the variable of
the same name (OpenTelemetry's SDK environment specification), read once at the entrypoint like
every other setting: the tracer provider is built from these values
(:mod:`bulk_recorder.infra.tracing`), never from the environment. A bad value fails start-up
naming the variable.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, field_validator
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
