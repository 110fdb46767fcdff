"""The fault schedule of the all-faults run, drawn from one seed (``random.Random(seed)``).

A schedule is a list of :class:`Fault`: when (seconds after the traffic starts), what kind,
against what, and for how long. The same seed and the same :class:`Plan` always give the same
schedule, so a failing seed reproduces on its own. Faults overlap on purpose; the only rules
are the ones a real cluster needs to stay recoverable, and the executor keeps them (one broker
node down at a time, since two of three leave the quorum queues without a majority; one
database failover, since the rig has one standby).

Pure: no I/O, unit-tested in ``tests/unit/test_fault_schedule.py``.
"""

from __future__ import annotations

import datetime
import os
import random
from dataclasses import dataclass
from typing import Literal

Kind = Literal[
    "broker_kill",  # SIGKILL a RabbitMQ node, restart it after `duration`
    "db_failover",  # SIGKILL the PostgreSQL primary, promote the standby
    "recorder_kill",  # SIGKILL a recorder process, start it again after `duration`
    "relay_kill",  # SIGKILL the relay, start it again after `duration`
    "broker_hold",  # the broker proxy of a process's node stops forwarding for `duration`
    "db_hold",  # the database proxy of the primary stops forwarding for `duration`
]
KINDS: tuple[Kind, ...] = (
    "broker_kill",
    "db_failover",
    "recorder_kill",
    "relay_kill",
    "broker_hold",
    "db_hold",
)
# Which process's broker connection a broker_hold aims at (the proxy of the node it is on).
HOLD_TARGETS = ("recorder-0", "recorder-1", "relay")


@dataclass(frozen=True)
class Plan:
    """How long the traffic runs and how many faults of each kind per minute of it."""

    seconds: float  # the traffic window; faults start inside it
    heartbeat_grace: float  # aiormq's grace: a broker hold lasts longer than this
    db_command_timeout: float  # BULK_RECORDER_DB_COMMAND_TIMEOUT_S: a db hold lasts longer
    per_minute: float = 0.0  # 0: exactly one fault of each kind (the short run)
    node_restart: float = 25.0  # a killed broker node takes about this long to boot and rejoin

    def count(self, kind: Kind) -> int:
        if kind == "db_failover" or self.per_minute <= 0:
            return 1
        # two recorders; a node takes ~25-40 s to come back on a busy machine and kills of
        # nodes wait for each other, so fewer of them
        weight = {"recorder_kill": 2.0, "broker_kill": 2 / 3}.get(kind, 1.0)
        return max(1, round(self.seconds / 60 * self.per_minute * weight))


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the traffic started
    kind: Kind
    target: str  # "node-1", "recorder-0", "relay", "primary", ...
    duration: float  # down or held for this long (0: not applicable)

    def line(self) -> str:
        length = f" for {self.duration:.1f} s" if self.duration else ""
        return f"t+{self.at:6.1f} s  {self.kind:<13} {self.target}{length}"


def draw(seed: int, plan: Plan) -> list[Fault]:
    """The schedule for ``seed``: every kind at least once, in time order."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    for kind in KINDS:
        for _ in range(plan.count(kind)):
            target, duration = _what(rng, kind, plan)
            # every fault starts inside the window and is over about when it ends: held ones,
            # and killed nodes back in the cluster
            restart = plan.node_restart if kind == "broker_kill" else 0.0
            latest = max(2.0, plan.seconds - duration - restart - 1.0)
            faults.append(Fault(round(rng.uniform(1.0, latest), 1), kind, target, duration))
    return sorted(faults, key=lambda f: (f.at, f.kind, f.target))


def _what(rng: random.Random, kind: Kind, plan: Plan) -> tuple[str, float]:
    if kind == "broker_kill":
        return f"node-{rng.randrange(3)}", round(rng.uniform(1.0, 4.0), 1)
    if kind == "db_failover":
        return "primary", 0.0
    if kind == "recorder_kill":
        return f"recorder-{rng.randrange(2)}", round(rng.uniform(0.2, 2.0), 1)
    if kind == "relay_kill":
        return "relay", round(rng.uniform(0.2, 2.0), 1)
    if kind == "broker_hold":
        extra = rng.uniform(1.0, 3.0)
        return rng.choice(HOLD_TARGETS), round(plan.heartbeat_grace + extra, 1)
    extra = rng.uniform(0.5, 2.0)
    return "primary", round(plan.db_command_timeout + extra, 1)


def run_seeds(long: bool, runs: int) -> list[int]:
    """The seeds a run draws its schedules from: SOAK_SEED's (comma-separated) when set; else
    ``runs`` fresh ones for a long run; else today's date, so that a short run in `make test`
    is the same all day and another the next."""
    named = os.environ.get("SOAK_SEED", "").strip()
    if named:
        return [int(s) for s in named.split(",")]
    if long:
        pick = random.SystemRandom()
        return [pick.randrange(1, 1_000_000) for _ in range(runs)]
    return [int(datetime.date.today().strftime("%Y%m%d"))]
