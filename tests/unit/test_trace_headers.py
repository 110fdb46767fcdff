"""The trace headers a caller or a publisher sends are bounded before OpenTelemetry parses them
(W3C: 32 members, 512 characters of ``tracestate`` are what must be propagated), and the
library's per-member warnings stay out of the log."""

from __future__ import annotations

import io
import logging

import pytest

from bulk_recorder.infra import tracing
from bulk_recorder.infra.logs import setup_logging

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_short_tracestate_is_kept_as_sent() -> None:
    state = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    assert tracing.bounded_tracestate(state) == state
    context = tracing.span_context_of({"traceparent": PARENT, "tracestate": state})
    assert context is not None
    assert context.trace_state.to_header() == state


@pytest.mark.parametrize(
    "state",
    [
        "k=" + "v" * 60_000,  # one huge member
        ",".join(f"k{i}=" + "v" * 100 for i in range(600)),  # 60 KB of members
        ",".join(f"k{i}=v" for i in range(100)),  # too many members
        "a=b," + "x" * 60_000 + ",c=d",
    ],
)
def test_a_tracestate_is_cut_to_32_members_and_512_characters(state: str) -> None:
    bounded = tracing.bounded_tracestate(state)
    if bounded is not None:
        assert len(bounded) <= 512
        assert len(bounded.split(",")) <= 32
        assert all(len(member) <= 128 for member in bounded.split(","))
        assert bounded.split(",") == [m for m in state.split(",") if m in bounded.split(",")]
    context = tracing.span_context_of({"traceparent": PARENT, "tracestate": state})
    assert context is not None  # the parent is kept: only the state is cut
    # what is propagated is the bounded state (OpenTelemetry alone drops every member of a
    # tracestate over 32 members, or with one member it refuses)
    assert context.trace_state.to_header() == (bounded or "")


def test_the_first_whole_members_are_kept() -> None:
    state = "a=b," + "x" * 60_000 + ",c=d"
    assert tracing.bounded_tracestate(state) == "a=b,c=d"
    many = ",".join(f"k{i}=v" for i in range(100))
    assert tracing.bounded_tracestate(many) == ",".join(f"k{i}=v" for i in range(32))


def test_an_oversized_traceparent_is_no_context() -> None:
    assert tracing.span_context_of({"traceparent": "01-" + "a" * 60_000}) is None


def test_opentelemetrys_member_warnings_stay_out_of_the_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, otel = logging.getLogger(), logging.getLogger("opentelemetry.trace.span")
    saved = (root.handlers[:], root.level, otel.level)
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    try:
        setup_logging("INFO", "text")
        carrier = {"traceparent": PARENT, "tracestate": "a=b,\nFORGED LINE: x"}
        assert tracing.span_context_of(carrier) is not None
        assert tracing.span_context_of({"traceparent": PARENT, "tracestate": "B@D=x" * 20})
    finally:
        root.handlers[:], otel.level = saved[0], saved[2]
        root.setLevel(saved[1])
    assert stream.getvalue() == ""
