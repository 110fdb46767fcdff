"""``bulk-recorder tune``: the consumer timeout, release time and delivery limit, from measurements.

It reads what the recorders measured (``bulk_recorder_delivery_hold_seconds`` and
``bulk_recorder_delivery_attempt``, see docs/reference.md) and the values they run with
(``bulk_recorder_release_after_seconds``, ``bulk_recorder_delivery_limit``), either from each
recorder's ``/metrics`` (histograms summed across them) or from a Prometheus server (its query
API, over ``--window``). The broker's ``consumer_timeout`` is not visible to a client: give it with
``--consumer-timeout``, else RabbitMQ's default (30 min) is assumed and said so. The conclusions
are :mod:`consumer.tools.tune_advice`'s. It needs no settings: it runs from any host that reaches
the URLs. A URL that cannot be read, or answers no recorder metrics, exits 1.
"""

from __future__ import annotations

import argparse
import json
import math
import urllib.parse
from collections import defaultdict

from bulk_recorder.exceptions import EXIT_SETTINGS, BulkRecorderError
from bulk_recorder.url_checks import UNREADABLE, scheme_of, url_problem
from consumer.tools.tune_advice import (
    RABBITMQ_DEFAULT_CONSUMER_TIMEOUT_S,
    Histogram,
    Measured,
    advise,
    as_json,
    render,
)

HOLD = "bulk_recorder_delivery_hold_seconds"
ATTEMPT = "bulk_recorder_delivery_attempt"
LIMIT = "bulk_recorder_delivery_limit"
RELEASE = "bulk_recorder_release_after_seconds"
TIMEOUT_S = 10.0
# This service's recorders on a shared Prometheus: the `service` label the PodMonitor and
# deploy/prometheus/prometheus.yml give its targets (another application may run a job="recorder").
RECORDERS = 'service="bulk-recorder", job="recorder"'


class TuneSourceError(BulkRecorderError):
    """A /metrics or Prometheus URL could not be read, or holds no recorder's figures (exit 1)."""


def _get(url: str) -> str:
    """The body at ``url``; a URL that cannot be parsed is said so in our words (urllib's and
    http.client's errors quote it, or the piece of a password before a ``/``, ``?`` or ``#``),
    and one with no scheme is not shown (masking would not find its password)."""
    import http.client  # when it runs: `bulk-recorder --help` builds this parser
    import urllib.error
    import urllib.request

    shown = url if scheme_of(url) else "a URL with no scheme (http://)"
    problem = url_problem(url, strict_query=False)
    if problem:
        raise TuneSourceError(f"cannot read {shown}: the URL {problem}")
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
            return str(answer.read().decode("utf-8", errors="replace"))
    except (http.client.InvalidURL, ValueError):
        raise TuneSourceError(f"cannot read {shown}: {UNREADABLE}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise TuneSourceError(f"cannot read {shown}: {exc}") from exc


class TuneUsageError(BulkRecorderError):
    """The command line names no source, or two kinds of source (exit 2)."""

    exit_code = EXIT_SETTINGS


# -- recorders' /metrics ----------------------------------------------------------------------


def from_metrics(urls: list[str], consumer_timeout_s: float | None) -> Measured:
    """Sum the histograms of every recorder; the least safe value in force across them."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[tuple[str, str], dict[float, float]] = defaultdict(lambda: defaultdict(float))
    limits: list[float] = []
    releases: list[float] = []
    for url in urls:
        text = _get(url)
        seen = False
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in (HOLD + "_bucket", ATTEMPT + "_bucket"):
                    seen = True
                    key = (
                        sample.name,
                        "" if sample.name.startswith(HOLD) else sample.labels["outcome"],
                    )
                    buckets[key][float(sample.labels["le"])] += sample.value
                elif sample.name == LIMIT and sample.value > 0:
                    limits.append(sample.value)
                elif sample.name == RELEASE and sample.value > 0:
                    releases.append(sample.value)
        if not seen:
            raise TuneSourceError(f"{url} holds no {HOLD} (not a recorder's /metrics?)")
    return _measured(
        {key: Histogram.from_counts(dict(counts)) for key, counts in buckets.items()},
        min(limits) if limits else None,
        max(releases) if releases else None,
        consumer_timeout_s,
    )


def _measured(
    histograms: dict[tuple[str, str], Histogram],
    limit: float | None,
    release: float | None,
    consumer_timeout_s: float | None,
) -> Measured:
    empty = Histogram(())
    return Measured(
        hold=histograms.get((HOLD + "_bucket", ""), empty),
        recorded_attempts=histograms.get((ATTEMPT + "_bucket", "recorded"), empty),
        dead_lettered_attempts=histograms.get((ATTEMPT + "_bucket", "dead_lettered"), empty),
        delivery_limit=None if limit is None else int(limit),
        release_after_s=release,
        consumer_timeout_s=consumer_timeout_s or RABBITMQ_DEFAULT_CONSUMER_TIMEOUT_S,
        consumer_timeout_assumed=consumer_timeout_s is None,
    )


# -- a Prometheus server ----------------------------------------------------------------------


def _query(server: str, promql: str) -> list[tuple[dict[str, str], float]]:
    url = server.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        answer = json.loads(_get(url))
        if answer.get("status") != "success":
            raise TuneSourceError(f"Prometheus refused {promql!r}: {answer.get('error')}")
        return [(r["metric"], float(r["value"][1])) for r in answer["data"]["result"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise TuneSourceError(f"{server} did not answer as a Prometheus server: {exc}") from exc


def from_prometheus(
    server: str, selector: str, window: str, consumer_timeout_s: float | None
) -> Measured:
    """``sum by (le)`` of each histogram's increase over ``window``, across every series the
    selector picks; the least safe value in force (max release time, min delivery limit)."""
    histograms: dict[tuple[str, str], Histogram] = {}
    for name, outcome in ((HOLD, ""), (ATTEMPT, "recorded"), (ATTEMPT, "dead_lettered")):
        labels = ",".join(
            part for part in (selector, f'outcome="{outcome}"' if outcome else "") if part
        )
        rows = _query(server, f"sum by (le) (increase({name}_bucket{{{labels}}}[{window}]))")
        counts = {float(metric["le"]): value for metric, value in rows if not math.isnan(value)}
        histograms[(name + "_bucket", outcome)] = Histogram.from_counts(counts)
    if not any(h.buckets for h in histograms.values()):
        raise TuneSourceError(f"{server} has no {HOLD} for {{{selector}}} over {window}")
    limit = _query(server, f"min({LIMIT}{{{selector}}} > 0)")
    release = _query(server, f"max({RELEASE}{{{selector}}} > 0)")
    return _measured(
        histograms,
        limit[0][1] if limit else None,
        release[0][1] if release else None,
        consumer_timeout_s,
    )


# -- the command ------------------------------------------------------------------------------


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tune = sub.add_parser(
        "tune",
        help="measured hold times and attempts -> consumer_timeout, release time, delivery limit",
    )
    tune.add_argument("urls", nargs="*", metavar="METRICS_URL", help="recorders' /metrics URLs")
    tune.add_argument("--prometheus", metavar="URL", help="read a Prometheus server instead")
    tune.add_argument(
        "--selector",
        default=RECORDERS,
        help=f"the recorders' series on the Prometheus server (default: {RECORDERS})",
    )
    tune.add_argument("--window", default="7d", help="Prometheus range to measure over")
    tune.add_argument(
        "--consumer-timeout",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="the broker's consumer_timeout in force, in seconds (default: RabbitMQ's 1800)",
    )
    tune.add_argument("--json", action="store_true", help="one JSON object, for scripts")


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError("must be a positive number of seconds")
    return value


def cmd_tune(args: argparse.Namespace) -> int:
    if bool(args.urls) == bool(args.prometheus):
        raise TuneUsageError("give recorders' /metrics URLs or --prometheus URL (one of them)")
    if args.prometheus:
        measured = from_prometheus(
            args.prometheus, args.selector, args.window, args.consumer_timeout
        )
        sources = 1
    else:
        measured = from_metrics(args.urls, args.consumer_timeout)
        sources = len(args.urls)
    advice = advise(measured)
    if args.json:
        print(json.dumps(as_json(advice, measured, sources), indent=2))
    else:
        print(render(advice, measured, sources))
    return 0
