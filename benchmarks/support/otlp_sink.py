"""A local OTLP/HTTP traces receiver for the benchmarks: answers every ``POST /v1/traces`` with
an empty ``ExportTraceServiceResponse`` at once and keeps the bodies, parsed only after the
run (so that the receiver's own CPU stays out of the measured window as far as it can)."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_ANSWER = ExportTraceServiceResponse().SerializeToString()


class OtlpSink:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                sink.bodies.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(_ANSWER)))
                self.end_headers()
                self.wfile.write(_ANSWER)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def take_spans(self) -> int:
        """Spans received since the last call (the bodies are parsed now, then dropped)."""
        bodies, self.bodies = self.bodies, []
        count = 0
        for body in bodies:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            count += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        return count

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
