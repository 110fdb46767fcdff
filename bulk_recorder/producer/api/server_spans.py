"""The API's server spans: one per ``/v1`` request, in the caller's trace when it sent one.

A pure ASGI middleware of a few lines rather than opentelemetry-instrumentation-asgi: that
package reads its own ``OTEL_*`` variables, wraps every ``send`` and ``receive`` of a streamed
job upload in spans of their own, and is a beta release line; here the span is opened only
when tracing is on (the middleware is not even installed otherwise, see ``create_app``), with
HTTP semantic-convention names and attributes. The caller's ``traceparent``/``tracestate`` are
honoured (W3C TraceContext): the server span is their child, the outbox rows the request writes
keep it (:func:`bulk_recorder.infra.tracing.current_carrier`). They are read before the request
is authenticated, so :func:`bulk_recorder.infra.tracing.span_context_of` bounds them before
OpenTelemetry parses them (``tracestate``: 32 members, 512 characters).
"""

from __future__ import annotations

from bulk_recorder.infra import tracing
from bulk_recorder.producer.api.asgi import ASGIApp, Receive, Scope, Send, StatusSeen

_CONTEXT_HEADERS = (b"traceparent", b"tracestate")


class ServerSpans:
    """``{method} {route}`` SERVER spans around the ``/v1`` requests."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope.get("headers", ())
            if name in _CONTEXT_HEADERS
        }
        from opentelemetry.trace import SpanKind, Status, StatusCode  # only a traced API's

        parent = tracing.context_of(carrier.get("traceparent"), carrier.get("tracestate"))
        method = str(scope.get("method", "GET"))
        attributes: dict[str, str | int] = {
            "http.request.method": method,
            "url.path": str(scope.get("path", "")),
            "url.scheme": str(scope.get("scheme", "http")),
        }
        server = scope.get("server")
        if server:
            attributes["server.address"], attributes["server.port"] = server[0], int(server[1])
        client = scope.get("client")
        if client:
            attributes["client.address"] = client[0]
        with tracing.tracer().start_as_current_span(
            method, context=parent, kind=SpanKind.SERVER, attributes=attributes
        ) as span:
            seen = StatusSeen(send)
            try:
                await self.app(scope, receive, seen)
            finally:
                status = seen.status
                route = getattr(scope.get("route"), "path", None)
                if route:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_attribute("error.type", str(status))
                    span.set_status(Status(StatusCode.ERROR))
