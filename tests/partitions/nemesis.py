"""The partition nemesis: a schedule drawn from one seed, applied on the hosted rig, logged.

A schedule is a list of :class:`Fault`: when (seconds after the traffic started), what kind,
the two sides (host names of tests/rigs/hosted.py), and for how long. The same seed and plan
always give the same schedule (``random.Random(seed)``), so a failing seed reproduces alone.

Kinds are entries of :data:`KINDS` (a name and a :class:`Kind`), so the list can grow: a kind
draws its sides from the rng and says how it is made (``"cut"``: both ways; ``"drop"``: packets
from side a to side b only) or gives its own ``apply`` coroutine (e.g. a cut followed by a
promotion). Faults overlap as they fall: each removes only its own rules when it ends
(``Net.restore``), as in the all-faults run; the caller waits for the cluster to be whole again
afterwards.

:class:`Nemesis` applies a schedule: ``applied`` keeps, for each fault, when it began and ended
(seconds after the traffic started) and what it met, for the report.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from tests.rigs.hosted import BROKERS, DATABASES, HOSTS, SERVICES, Hosted

Sides = tuple[tuple[str, ...], tuple[str, ...]]
CLIENTS = ("rec1", "rec2", "relay")  # the services that hold broker connections


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the traffic started
    kind: str
    a: tuple[str, ...]
    b: tuple[str, ...]
    duration: float

    def line(self) -> str:
        arrow = " -> " if KINDS[self.kind].mode == "drop" else " | "
        sides = f"{','.join(self.a)}{arrow}{','.join(self.b)}"
        return f"t+{self.at:6.1f} s  {self.kind:<18} {sides} for {self.duration:.1f} s"


Apply = Callable[["Nemesis", Fault], Awaitable[str]]  # (the nemesis, the fault) -> a note


@dataclass(frozen=True)
class Kind:
    """How a kind of fault is drawn and made."""

    draw: Callable[[random.Random], Sides]
    mode: Literal["cut", "drop"] = "cut"
    seconds: tuple[float, float] = (12.0, 18.0)  # its duration, drawn in this range
    apply: Apply | None = None  # instead of the mode's rule: a coroutine of its own


def _broker_minority(rng: random.Random) -> Sides:
    node = rng.choice(BROKERS)
    return (node,), tuple(b for b in BROKERS if b != node)


def _isolated(hosts: tuple[str, ...]) -> Callable[[random.Random], Sides]:
    def draw(rng: random.Random) -> Sides:
        host = rng.choice(hosts)
        return (host,), tuple(h for h in HOSTS if h != host)

    return draw


def _client_one_way(rng: random.Random) -> Sides:
    client, node = rng.choice(CLIENTS), rng.choice(BROKERS)
    return ((client,), (node,)) if rng.random() < 0.5 else ((node,), (client,))


def _primary_standby(rng: random.Random) -> Sides:
    return (DATABASES[0],), (DATABASES[1],)


def _service_database_one_way(rng: random.Random) -> Sides:
    service = rng.choice(SERVICES)
    primary = DATABASES[0]
    return ((service,), (primary,)) if rng.random() < 0.5 else ((primary,), (service,))


def _halves(rng: random.Random) -> Sides:
    hosts = list(HOSTS)
    rng.shuffle(hosts)
    cut = rng.randrange(2, len(hosts) - 1)
    return tuple(sorted(hosts[:cut])), tuple(sorted(hosts[cut:]))


# The kinds, by name. Add PostgreSQL-side ones here (a mode, or an `apply` of their own).
KINDS: dict[str, Kind] = {
    # a broker node cut from its two peers, its clients still reach it
    "broker_minority": Kind(_broker_minority),
    # a broker node cut from every host (clients and peers)
    "broker_isolated": Kind(_isolated(BROKERS)),
    # a recorder, the relay or the API cut from every host
    "service_isolated": Kind(_isolated(SERVICES)),
    # one direction between a client and a broker node lost, the other flows
    "client_broker_one_way": Kind(_client_one_way, mode="drop"),
    # every host on one of two random sides
    "halves": Kind(_halves),
    # the PostgreSQL primary cut from its synchronous standby: commits wait, nothing is acked
    "primary_standby": Kind(_primary_standby),
    # one direction between a service (a recorder, the relay, the API) and the primary lost
    "service_database_one_way": Kind(_service_database_one_way, mode="drop"),
}

# The short run of make test draws from the network kinds it was first measured with; the
# long run (make soak-partitions) from every kind, the database's included.
SHORT_KINDS = (
    "broker_minority",
    "broker_isolated",
    "service_isolated",
    "client_broker_one_way",
    "halves",
)


@dataclass(frozen=True)
class Plan:
    """How long the traffic runs and how many faults are drawn in it."""

    seconds: float  # faults start inside this window, and are over by its end
    faults: int  # how many; each kind at least once when there are as many as kinds


def draw(seed: int, plan: Plan, kinds: tuple[str, ...] | None = None) -> list[Fault]:
    """The schedule for ``seed``: ``plan.faults`` faults of ``kinds`` (default all), each kind
    once before any repeats, at random times inside the window: they overlap as they fall."""
    rng = random.Random(seed)
    names = list(kinds or KINDS)
    rng.shuffle(names)
    order = [names[i % len(names)] for i in range(plan.faults)]
    faults = []
    for name in order:
        kind = KINDS[name]
        a, b = kind.draw(rng)
        duration = round(rng.uniform(*kind.seconds), 1)
        at = round(rng.uniform(1.0, max(1.5, plan.seconds - duration)), 1)
        faults.append(Fault(at, name, a, b, duration))
    return sorted(faults, key=lambda f: (f.at, f.kind))


@dataclass
class Applied:
    fault: Fault
    began: float
    ended: float
    note: str = ""

    def line(self) -> str:
        note = f"  ({self.note})" if self.note else ""
        f = self.fault
        arrow = " -> " if KINDS[f.kind].mode == "drop" else " | "
        sides = f"{','.join(f.a)}{arrow}{','.join(f.b)}"
        return f"t+{self.began:6.1f} .. {self.ended:6.1f} s  {f.kind:<21} {sides}{note}"


@dataclass
class Nemesis:
    """Applies a schedule on ``hosted`` (a :class:`~tests.rigs.hosted.Hosted`), overlapping."""

    hosted: Hosted
    t0: float = field(default_factory=time.monotonic)
    applied: list[Applied] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def run(self, schedule: list[Fault]) -> None:
        """Apply each fault at its time from now (t0), each its own task; returns once every
        one is over (its rules removed)."""
        self.t0 = time.monotonic()
        async with asyncio.TaskGroup() as group:
            for fault in schedule:
                group.create_task(self._at(fault))

    async def _at(self, fault: Fault) -> None:
        await asyncio.sleep(max(0.0, fault.at - self.now()))
        began = self.now()
        print(f"nemesis t+{began:.1f} s: begins {fault.line().split(' s  ', 1)[1]}")
        note = await (KINDS[fault.kind].apply or _by_mode)(self, fault)
        self.applied.append(Applied(fault, began, self.now(), note))
        print(f"nemesis {self.applied[-1].line()}")


async def _by_mode(nemesis: Nemesis, fault: Fault) -> str:
    net = nemesis.hosted.net
    make = net.drop if KINDS[fault.kind].mode == "drop" else net.cut
    partition = await asyncio.to_thread(make, fault.a, fault.b)
    await asyncio.sleep(fault.duration)
    await asyncio.to_thread(net.restore, partition)
    return ""
