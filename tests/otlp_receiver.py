"""A real OTLP/HTTP traces receiver for the tests: ``POST /v1/traces`` on a free loopback port.

Each body is parsed as an ``ExportTraceServiceRequest`` with opentelemetry-proto (gzip bodies
too) and kept; the answer is an empty ``ExportTraceServiceResponse``, as a collector gives. Runs
in a thread (``http.server``), so that the services under test export to it while the test's
event loop waits on conditions.
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

KINDS = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


@dataclass
class Span:
    """One received span, with ids in hex and attributes as a dict."""

    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace id, span id)
    status: int

    @classmethod
    def of(cls, service: str, span: ProtoSpan) -> Span:
        return cls(
            service=service,
            name=span.name,
            kind=KINDS.get(span.kind, str(span.kind)),
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            parent_id=span.parent_span_id.hex(),
            attributes={a.key: _value(a.value) for a in span.attributes},
            links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
            status=span.status.code,
        )


@dataclass
class OtlpReceiver:
    port: int = 0
    requests: int = 0
    spans: list[Span] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        """The OTEL_EXPORTER_OTLP_ENDPOINT (base URL) for the services."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            self.requests += 1
            for resource_spans in request.resource_spans:
                attributes = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                service = str(attributes.get("service.name", ""))
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(Span.of(service, s) for s in scope_spans.spans)

    def snapshot(self) -> list[Span]:
        with self._lock:
            return list(self.spans)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
