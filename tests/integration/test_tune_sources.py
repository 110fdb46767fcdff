"""``bulk-recorder tune`` over HTTP: several recorders' /metrics are summed, the least safe value in
force wins, and a URL that is no recorder's /metrics exits 1 with one line."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from prometheus_client import generate_latest

from bulk_recorder.infra.metrics import Metrics
from consumer.cli import main
from consumer.tools.tune import from_metrics


def _recorder(limit: int, release: float, holds: list[float], attempts: list[int]) -> bytes:
    metrics = Metrics()
    metrics.delivery_limit.set(limit)
    metrics.release_after.set(release)
    metrics.delivery_hold.observe_many(holds, "acked")
    metrics.delivery_attempt.observe_many([float(a) for a in attempts], "recorded")
    return generate_latest(metrics.registry)


@pytest.fixture
def served() -> Iterator[dict[str, str]]:
    """Two recorders' /metrics and one page that is not, on a loopback HTTP server."""
    pages = {
        "/a/metrics": _recorder(5, 60.0, [0.2, 0.3], [1, 1]),
        "/b/metrics": _recorder(4, 120.0, [7.0], [2]),
        "/other": b"# HELP up something else\n# TYPE up gauge\nup 1\n",
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    yield {name: base + name for name in pages}
    server.shutdown()
    server.server_close()


def test_histograms_are_summed_and_the_least_safe_setting_is_in_force(
    served: dict[str, str],
) -> None:
    m = from_metrics([served["/a/metrics"], served["/b/metrics"]], None)
    assert m.hold.count == 3
    assert m.hold.worst() == 10.0  # 7 s, from b
    assert m.recorded_attempts.count == 3
    assert m.recorded_attempts.worst() == 2.0
    assert m.delivery_limit == 4  # the lower: reached sooner
    assert m.release_after_s == 120.0  # the longer: nearer the timeout
    assert m.consumer_timeout_assumed


def test_a_page_without_recorder_metrics_or_no_server_exits_1(
    served: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", served["/other"]]) == 1
    assert "holds no bulk_recorder_delivery_hold_seconds" in capsys.readouterr().err
    assert main(["tune", served["/a/metrics"].replace("/a/", "/missing/")]) == 1
    assert "cannot read" in capsys.readouterr().err
    assert main(["tune", served["/a/metrics"], "--prometheus", served["/other"]]) == 2
    assert main(["tune", served["/a/metrics"], "--json"]) == 0
    assert '"attempts_needed": 1' in capsys.readouterr().out


# This service's recorders and another application's, both with job="recorder", as one
# Prometheus holds them: (bucket bound -> hold count, delivery limit in force).
OURS = ({"1.0": 2.0, "+Inf": 2.0}, 5.0)
FOREIGN = ({"1.0": 0.0, "+Inf": 7.0}, 2.0)


@pytest.fixture
def prometheus_with_a_foreign_recorder() -> Iterator[tuple[str, list[str]]]:
    """A Prometheus query API answering for the series a query's selector picks: this
    service's alone when it names service="bulk-recorder", both applications' otherwise."""
    queries: list[str] = []

    def answer(promql: str) -> list[dict[str, object]]:
        picked = [OURS] if 'service="bulk-recorder"' in promql else [OURS, FOREIGN]
        if "bulk_recorder_delivery_limit" in promql:
            return [{"metric": {}, "value": [0, str(min(limit for _, limit in picked))]}]
        if "_bucket" not in promql or 'outcome="dead_lettered"' in promql:
            return []
        return [
            {"metric": {"le": le}, "value": [0, str(sum(b[le] for b, _ in picked))]}
            for le in OURS[0]
        ]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            (promql,) = parse_qs(urlsplit(self.path).query)["query"]
            queries.append(promql)
            body = {"status": "success", "data": {"resultType": "vector", "result": answer(promql)}}
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", queries
    server.shutdown()
    server.server_close()


def test_tune_reads_only_this_services_recorders_by_default(
    prometheus_with_a_foreign_recorder: tuple[str, list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Another application's job="recorder" in the same Prometheus is not measured."""
    url, queries = prometheus_with_a_foreign_recorder
    assert main(["tune", "--prometheus", url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["measured"]["settled"] == 2, report
    assert report["in_force"]["delivery_limit"] == 5, report
    assert queries, "tune asked Prometheus nothing"
    for promql in queries:
        assert 'service="bulk-recorder"' in promql, promql
        assert 'job="recorder"' in promql, promql
