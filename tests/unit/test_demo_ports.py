"""The demo's ports for its recorder, relay and API come from below the kernel's range for port 0.

A port the kernel gave for port 0, closed again, can go to the next process that binds port 0
before the demo's role binds it: in a shuffled ``make test`` another test's health server took
the demo's API port, answered its readiness probe with 200, and refused the job's upload with
405 (``test_demo_passes_its_checks[api]``). Below the range, only a process that asks for that
very port can take it.
"""

from __future__ import annotations

import importlib
import os
import socket
import time
from pathlib import Path

import pytest

from consumer.tools import demo_support
from consumer.tools.demo_support import free_port
from tests import suite_lock

pytestmark = pytest.mark.private

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
SUITES_REGISTRY = demo_support._registry  # as tests/conftest.py set it, before any test here


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


# Two pickers side by side (two pytest workers, a rig and a role) that draw the same number: a
# port is free until the role it was picked for binds it, seconds later for a RabbitMQ node, so
# both bind-checks pass. make test's exclusive lanes lost the cluster rig that way: its first
# node's AMQP port (22778) was bound by the time the node booted (eaddrinuse).
@pytest.fixture(autouse=True)
def _registry_of_its_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test here hands out ports through a folder of its own (the suite's comes back after
    it): the ports other tests handed out lately are no part of what it checks."""
    monkeypatch.setattr(demo_support, "_registry", None)
    demo_support.share_ports_through(tmp_path / "ports")


def _draws(monkeypatch: pytest.MonkeyPatch, ports: list[int]) -> None:
    draws = iter(ports)
    monkeypatch.setattr(demo_support, "_candidate", lambda candidates: next(draws))
    monkeypatch.setattr(demo_support, "_ephemeral_low", lambda: 65_536)


def _pick_in_a_child(registry: Path, first: int) -> int:
    """free_port in a forked process that draws ``first`` first, as another worker would."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.close(reader)
        demo_support._candidate = lambda candidates: first
        demo_support.share_ports_through(registry)
        try:
            os.write(writer, str(demo_support.free_port()).encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as answer:
        port = int(answer.read())
    os.waitpid(child, 0)
    return port


def test_a_port_another_process_picked_is_not_handed_out_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    start = demo_support.PICK_FROM.start
    _draws(monkeypatch, [start + 11, start + 12])  # the child draws its own first
    assert _pick_in_a_child(tmp_path, start + 11) == start + 11  # picked, never bound
    demo_support.share_ports_through(tmp_path)
    assert free_port() == start + 12


def test_a_port_is_not_handed_out_twice_by_one_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    start = demo_support.PICK_FROM.start
    _draws(monkeypatch, [start + 3, start + 3, start + 4])
    demo_support.share_ports_through(tmp_path)
    assert [free_port(), free_port()] == [start + 3, start + 4]


@pytest.mark.parametrize(
    ("age_s", "again"),
    # ten minutes: longer than a rig waits for its nodes to boot (90 s each, one at a time)
    [(599, False), (600, True), (601, True)],
)
def test_a_port_is_handed_out_again_once_kept_long_enough(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, age_s: float, again: bool
) -> None:
    start = demo_support.PICK_FROM.start
    _draws(monkeypatch, [start + 5, start + 5, start + 6])
    demo_support.share_ports_through(tmp_path)
    assert free_port() == start + 5
    record = tmp_path / str(start + 5)
    then = time.time() - age_s
    os.utime(record, (then, then))
    assert free_port() == (start + 5 if again else start + 6)


def test_the_suite_shares_its_ports_through_one_folder_on_the_machine() -> None:
    # tests/conftest.py points every worker's (and every side-by-side suite's) picks there
    assert suite_lock.lock_dir() / "ports" == SUITES_REGISTRY
