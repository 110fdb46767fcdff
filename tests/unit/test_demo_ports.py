"""The demo's ports for its recorder, relay and API come from below the kernel's range for port 0.

A port the kernel gave for port 0, closed again, can go to the next process that binds port 0
before the demo's role binds it: in a shuffled ``make test`` another test's health server took
the demo's API port, answered its readiness probe with 200, and refused the job's upload with
405 (``test_demo_passes_its_checks[api]``). Below the range, only a process that asks for that
very port can take it.
"""

from __future__ import annotations

import importlib
import socket
from pathlib import Path

import pytest

from consumer.tools import demo_support
from consumer.tools.demo_support import free_port

pytestmark = pytest.mark.private

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@pytest.mark.skipif(not RANGE.exists(), reason="the kernel's port range is Linux's")
def test_the_ports_are_below_the_kernels_range_and_free() -> None:
    low = int(RANGE.read_text().split()[0])
    for _ in range(50):
        port = free_port()
        assert port < low, f"{port}: in the kernel's range for port 0 ({low} and up)"
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: the role that gets it can bind it


def test_a_port_taken_meanwhile_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = taken.getsockname()[1]
        choices = iter([held, demo_support.PICK_FROM.start + 7])
        monkeypatch.setattr(demo_support, "_candidate", lambda candidates: next(choices))
        monkeypatch.setattr(demo_support, "_ephemeral_low", lambda: 65_536)
        assert free_port() == demo_support.PICK_FROM.start + 7


def test_the_ports_kept_clear_on_this_machine_are_never_picked() -> None:
    # the black-box checks' ports (5790-5799, 25790-25799, 9464) lie outside the range
    for port in (*range(5790, 5800), *range(25790, 25800), 9464):
        assert port not in demo_support.PICK_FROM


@pytest.mark.parametrize("module", ["benchmarks.support.recorder", "benchmarks.bench_api_latency"])
def test_the_benchmarks_roles_take_their_ports_from_the_same_helper(module: str) -> None:
    # they took port 0 from the kernel, with the same race as the demo's
    assert importlib.import_module(module).free_port is demo_support.free_port
