"""Hosts in network namespaces, joined by a bridge, and silent partitions between them.

Every fault before this rig was made by a TCP proxy or a SIGKILL; the broker nodes and the
PostgreSQL standby talked to each other directly. Here each host of a test (a RabbitMQ node, a
PostgreSQL server, a recorder, the relay, the API) lives in a network namespace of its own with
one address, and the nemesis drops packets between hosts inside those namespaces. Nothing is
added to the machine's own (root) namespace: no address, no route, no rule, no interface.
Needs root, ``ip`` (iproute2) and ``nft`` (nftables); :func:`missing` says what is absent.

Layout (all made by :meth:`Net.start`, all removed by :meth:`Net.close`)::

    <prefix>-sw      the switch: bridge br0, one veth end per host (v1, v2, ...)
    <prefix>-<host>  one per host: eth0 (the veth's other end) with 10.47.0.N/24, lo up,
                     nft table ``inet nemesis`` (chain ``input``: the partitions;
                     chain ``steer``: reject rules for placing clients, see :meth:`Net.steer`)
    <prefix>-obs     the observer: the test's own eyes on the hosts (a host like the others,
                     never partitioned by :meth:`Net.isolate`)

``prefix`` is ``brnx-<pid>-<4 hex>``; :func:`sweep_stale` (called by :meth:`Net.start`)
removes the namespaces (and kills the processes inside) of runs whose pid is gone, e.g. a
SIGKILLed pytest. The addresses exist only inside the rig's namespaces, so runs side by side
do not collide.

API:

- ``Net(["mq1", "mq2", "pg1", ...]).start()`` (or ``with Net(...) as net``); ``net.close()``
  kills every process left in the namespaces and deletes them; ``net.leftovers()`` lists what
  is left (namespaces of this run, root links or nft rules that differ from before): ``[]``.
- ``net.host("mq1") -> Host``: ``.ns``, ``.address``, ``.argv(cmd)`` (``ip netns exec``),
  ``.run(cmd)``, ``.connect(address, port)`` (a blocking socket made inside the namespace),
  ``.port_open(port, address=None)``.
- Partitions (silent: ``drop`` in the receiver's input chain, so established connections stop
  too, without a reset; conntrack does not bypass a filter drop):
  ``net.cut(a, b)`` both ways between two sets of host names, ``net.drop(src, dst)`` one way
  (packets from ``src`` to ``dst`` are lost, the other direction flows), ``net.isolate(name)``
  (from every other host, the observer excepted); each returns a :class:`Partition` that
  ``net.restore(p)`` removes alone (partitions may overlap), ``net.heal()`` removes them all;
  ``net.active()`` describes what is in force.
- ``net.steer(clients, refuse=[...], port=5672)`` rejects (TCP reset, fast) connects from
  ``clients`` to the ``refuse`` hosts' port, so that clients that pick a node at random land
  on the one left; ``net.unsteer()``. Placement, not a fault.
- From asyncio, :class:`Forward` (``await net.forward(host, port)``): a TCP forwarder listening
  on 127.0.0.1 of the test's own namespace whose upstream sockets are made in the observer's
  namespace, so the test's clients (asyncpg, aio-pika, httpx) reach the hosts with no address
  in the root namespace. Closed by ``await net.close_forwards()`` (also by the fixtures).

Every method blocks (``ip``/``nft`` subprocesses, milliseconds each); from async tests call
them through ``asyncio.to_thread`` when the loop must keep running meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.proxy import TcpProxy

NETNS_DIR = Path("/run/netns")
PREFIX_ROOT = "brnx"
SUBNET = "10.47.0"  # /24, only inside the rig's namespaces
_OBSERVER = "obs"
_SWITCH = "sw"
_STALE = re.compile(rf"^{PREFIX_ROOT}-(\d+)-[0-9a-f]{{4}}-")
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def missing() -> list[str]:
    """What this rig lacks here: root, ``ip``, ``nft`` (empty when it can run)."""
    out = [] if os.geteuid() == 0 else ["root"]
    return out + [tool for tool in ("ip", "nft") if shutil.which(tool) is None]


def _run(cmd: Sequence[str], what: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        list(cmd), input=stdin, capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _enter(ns: str) -> None:
    """Move the calling thread (only it) into the network namespace ``ns``."""
    fd = os.open(NETNS_DIR / ns, os.O_RDONLY)
    try:
        if _libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {ns}: {os.strerror(errno)}")
    finally:
        os.close(fd)


@dataclass(eq=False)
class Host:
    """One namespace with one address on the rig's bridge."""

    name: str
    ns: str
    address: str
    _pool: ThreadPoolExecutor | None = field(default=None, repr=False)

    def argv(self, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run inside this host's namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.ns, *cmd]

    def run(self, cmd: Sequence[str], what: str = "", stdin: str | None = None) -> str:
        return _run(self.argv(cmd), what or f"{' '.join(cmd)} in {self.ns}", stdin)

    def executor(self) -> ThreadPoolExecutor:
        """Threads living in this namespace: sockets they make belong to it for good."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=4, thread_name_prefix=self.ns, initializer=_enter, initargs=(self.ns,)
            )
        return self._pool

    def new_socket(self, kind: int = socket.SOCK_STREAM) -> socket.socket:
        """A socket of this namespace (it may be used from any thread afterwards)."""
        return self.executor().submit(socket.socket, type=kind).result()

    def connect(self, address: str, port: int, timeout: float = 5) -> socket.socket:
        """A blocking connection from this namespace to ``address:port``."""
        return self.executor().submit(socket.create_connection, (address, port), timeout).result()

    def port_open(self, port: int, address: str | None = None, timeout: float = 1) -> bool:
        try:
            self.connect(address or self.address, port, timeout).close()
        except OSError:
            return False
        return True

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _namespaces() -> list[str]:
    return sorted(p.name for p in NETNS_DIR.iterdir()) if NETNS_DIR.exists() else []


def pids_in(ns: str) -> list[int]:
    with contextlib.suppress(RuntimeError):
        return [int(p) for p in _run(["ip", "netns", "pids", ns], "ip netns pids").split()]
    return []


def _remove(namespaces: Iterable[str]) -> None:
    """SIGKILL every process inside, then delete the namespaces (their links go with them)."""
    namespaces = list(namespaces)
    for _ in range(50):
        pids = {pid for ns in namespaces for pid in pids_in(ns)}
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for ns in namespaces:
        if (NETNS_DIR / ns).exists():
            _run(["ip", "netns", "delete", ns], f"ip netns delete {ns}")


def sweep_stale() -> list[str]:
    """Remove the namespaces of earlier runs whose process is gone; returns their names."""
    stale = []
    for ns in _namespaces():
        match = _STALE.match(ns)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            stale.append(ns)
    _remove(stale)
    return stale


def root_state(ns: str | None = None) -> str:
    """The root namespace's links and nft ruleset as text (compared before and after a run);
    ``ns``: another namespace's, for the rig's own tests."""
    inside = ["ip", "netns", "exec", ns] if ns else []
    links = _run([*inside, "ip", "-o", "link", "show"], "ip link show")
    names = sorted(line.split(":", 2)[1].strip() for line in links.splitlines())
    # stateless (-s): the rules without their counters, which other programs' rules (podman's
    # NAT rules) move with the run's own loopback traffic
    ruleset = _run([*inside, "nft", "-s", "list", "ruleset"], "nft -s list ruleset")
    return "links: " + " ".join(names) + "\nnft:\n" + ruleset


_TABLE = """
table inet nemesis {
  chain input { type filter hook input priority 0; policy accept; }
  chain steer { type filter hook input priority -10; policy accept; }
}
"""


def _set(addresses: Iterable[str]) -> str:
    return "{ " + ", ".join(sorted(addresses)) + " }"


@dataclass(frozen=True)
class Rule:
    host: str
    handle: int  # nft's rule handle in that host's input chain


@dataclass(frozen=True, eq=False)
class Partition:
    """One cut or drop in force: what it is, and its rules (for :meth:`Net.restore`)."""

    what: str
    rules: tuple[Rule, ...]


@dataclass
class Net:
    """The switch, the observer and one namespace for each name of ``hosts``."""

    hosts: Sequence[str]
    prefix: str = field(
        default_factory=lambda: f"{PREFIX_ROOT}-{os.getpid()}-{secrets.token_hex(2)}"
    )
    by_name: dict[str, Host] = field(default_factory=dict, init=False)
    _cuts: list[Partition] = field(default_factory=list, init=False)
    _root_before: str = field(default="", init=False)
    _forwards: list[Forward] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        names = [*self.hosts, _OBSERVER]
        if len(set(names)) != len(names) or len(names) > 200:
            raise ValueError(f"host names must be unique, at most 199: {self.hosts}")
        for i, name in enumerate(names):
            if not re.fullmatch(r"[a-z][a-z0-9]{0,11}", name):
                raise ValueError(f"host name {name!r}: a-z0-9, 12 characters at most")
            address = f"{SUBNET}.{i + 11}" if name != _OBSERVER else f"{SUBNET}.2"
            self.by_name[name] = Host(name, f"{self.prefix}-{name}", address)

    @property
    def switch(self) -> str:
        return f"{self.prefix}-{_SWITCH}"

    @property
    def observer(self) -> Host:
        return self.by_name[_OBSERVER]

    def host(self, name: str) -> Host:
        return self.by_name[name]

    def namespaces(self) -> list[str]:
        return [self.switch, *(h.ns for h in self.by_name.values())]

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> Net:
        lacking = missing()
        if lacking:
            raise RuntimeError(f"the netns rig needs {', '.join(lacking)}")
        swept = sweep_stale()
        if swept:
            print(f"netns rig: removed {len(swept)} stale namespaces of dead runs")
        self._root_before = root_state()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        _run(
            ["ip", "-b", "-"],
            "ip netns add",
            "".join(f"netns add {n}\n" for n in self.namespaces()),
        )
        switch = ["link set lo up", "link add br0 type bridge", "link set br0 up"]
        for i, host in enumerate(self.by_name.values(), start=1):
            switch += [
                f"link add v{i} type veth peer name eth0 netns {host.ns}",
                f"link set v{i} master br0",
                f"link set v{i} up",
            ]
        _run(["ip", "-n", self.switch, "-b", "-"], "switch", "\n".join(switch) + "\n")
        for host in self.by_name.values():
            _run(
                ["ip", "-n", host.ns, "-b", "-"],
                f"addresses of {host.ns}",
                f"link set lo up\naddr add {host.address}/24 dev eth0\nlink set eth0 up\n",
            )
            host.run(["nft", "-f", "-"], f"nft table in {host.ns}", _TABLE)

    def close(self) -> None:
        """Kill what runs inside, delete every namespace of this run (forwarders: see
        :meth:`close_forwards`)."""
        for host in self.by_name.values():
            host.shutdown()
        _remove(ns for ns in self.namespaces() if (NETNS_DIR / ns).exists())

    def leftovers(self) -> list[str]:
        """What this run left behind: its namespaces, root links or rules changed ([]: none)."""
        out = [f"namespace {ns}" for ns in _namespaces() if ns.startswith(self.prefix)]
        if self._root_before and root_state() != self._root_before:
            out.append(f"the root namespace changed:\n{root_state()}\nwas:\n{self._root_before}")
        out += [f"forwarder on 127.0.0.1:{f.port}" for f in self._forwards]
        return out

    def __enter__(self) -> Net:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- partitions -------------------------------------------------------------------------
    def _addresses(self, names: Iterable[str]) -> list[str]:
        return [self.by_name[n].address for n in names]

    def _input_rules(self, receivers: Iterable[str], senders: Iterable[str]) -> list[Rule]:
        rule = f"add rule inet nemesis input ip saddr {_set(self._addresses(senders))} drop\n"
        made = []
        for name in receivers:
            out = self.by_name[name].run(
                ["nft", "--echo", "--handle", "-f", "-"], f"nft drop in {name}", rule
            )
            handle = re.search(r"# handle (\d+)", out)
            if handle is None:
                raise RuntimeError(f"nft gave no rule handle: {out!r}")
            made.append(Rule(name, int(handle.group(1))))
        return made

    def _record(self, what: str, rules: list[Rule]) -> Partition:
        partition = Partition(what, tuple(rules))
        self._cuts.append(partition)
        return partition

    def drop(self, src: Iterable[str], dst: Iterable[str]) -> Partition:
        """One way: packets from the ``src`` hosts to the ``dst`` hosts are dropped silently."""
        src, dst = sorted(src), sorted(dst)
        rules = self._input_rules(dst, src)
        return self._record(f"{','.join(src)} -> {','.join(dst)} dropped", rules)

    def cut(self, a: Iterable[str], b: Iterable[str]) -> Partition:
        """Both ways between the sets ``a`` and ``b``: nothing passes, nobody is told."""
        a, b = sorted(a), sorted(b)
        if set(a) & set(b):
            raise ValueError(f"a host on both sides of a cut: {set(a) & set(b)}")
        rules = self._input_rules(a, b) + self._input_rules(b, a)
        return self._record(f"{','.join(a)} | {','.join(b)}", rules)

    def isolate(self, name: str) -> Partition:
        """``name`` cut from every other host (the observer still reaches it)."""
        others = [n for n in self.hosts if n != name]
        partition = self.cut([name], others)
        self._cuts[-1] = partition = Partition(f"{name} isolated", partition.rules)
        return partition

    def restore(self, partition: Partition) -> None:
        """Remove one partition's rules only (others in force stay: faults may overlap)."""
        for rule in partition.rules:
            self.by_name[rule.host].run(
                ["nft", "delete", "rule", "inet", "nemesis", "input", "handle", str(rule.handle)],
                f"nft delete in {rule.host}",
            )
        self._cuts = [c for c in self._cuts if c is not partition]

    def heal(self) -> None:
        """Every partition removed (placement by :meth:`steer` stays)."""
        for host in self.by_name.values():
            host.run(["nft", "flush", "chain", "inet", "nemesis", "input"], "nft flush")
        self._cuts.clear()

    def active(self) -> list[str]:
        return [c.what for c in self._cuts]

    def steer(self, clients: Iterable[str], refuse: Iterable[str], port: int) -> None:
        """Connects from ``clients`` to ``refuse``'s ``port`` are reset at once (placement)."""
        rule = (
            f"add rule inet nemesis steer ip saddr {_set(self._addresses(clients))} "
            f"tcp dport {port} reject with tcp reset\n"
        )
        for name in refuse:
            self.by_name[name].run(["nft", "-f", "-"], f"nft steer in {name}", rule)

    def unsteer(self) -> None:
        for host in self.by_name.values():
            host.run(["nft", "flush", "chain", "inet", "nemesis", "steer"], "nft flush")

    # -- the test's own connections ---------------------------------------------------------
    async def forward(self, host: str | Host, port: int) -> Forward:
        """A forwarder 127.0.0.1:<free port> -> ``host``:``port`` through the observer."""
        target = host if isinstance(host, Host) else self.by_name[host]
        forward = await Forward(self.observer, target.address, port).start()
        self._forwards.append(forward)
        return forward

    async def close_forwards(self) -> None:
        forwards, self._forwards = self._forwards, []
        for forward in forwards:
            await forward.close()


class Forward(TcpProxy):
    """A :class:`TcpProxy` whose upstream connections leave from ``origin``'s namespace."""

    def __init__(self, origin: Host, target_host: str, target_port: int) -> None:
        super().__init__(target_host, target_port)
        self.origin = origin

    async def open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        sock = await loop.run_in_executor(self.origin.executor(), socket.socket)
        try:
            sock.setblocking(False)
            await asyncio.wait_for(
                loop.sock_connect(sock, (self.target_host, self.target_port)), 10
            )
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock)
