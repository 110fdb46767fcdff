"""Throwaway RabbitMQ nodes for tests that need a broker of their own.

Some faults cannot be made on the machine's shared broker without hurting every other test on
it: a memory or disk alarm, a small ``max_message_size``, a TLS listener, a cluster whose nodes
die. :class:`RabbitNode` starts the installed ``rabbitmq-server`` as a separate node with its own
name, AMQP port, distribution port, data, log and config directories, all under one folder of
the test's. It never reads or writes the machine's own node configuration
(``/etc/rabbitmq``): ``RABBITMQ_CONF_ENV_FILE`` points to an empty file of ours.

The node runs in the foreground as our child (``RUNNING_UNDER_SYSTEMD`` makes the start script
``exec`` the Erlang VM), so :meth:`RabbitNode.kill` is a real SIGKILL of the broker process and
:meth:`RabbitNode.stop` an orderly stop. Nodes that share a ``cookie`` can be clustered
(:meth:`RabbitNode.join`).

Questions to a node (its queues, the cluster as it sees it, any Erlang expression) go through
``erl_call`` (:meth:`RabbitNode.erl`), Erlang/OTP's C client: milliseconds and no CPU to speak
of, where each ``rabbitmqctl`` call boots an Erlang VM (0.6 to 1 CPU-s; the rigs poll while
leaders move and partitions heal), and so do the joins (:meth:`RabbitNode.erl_ok`).

Ports: callers choose them; keep clear of 5790-5799 and 25790-25799, which other checks on this
machine use. :func:`free_port` finds a free one.

``host`` (a :class:`~tests.rigs.netns.Host`) runs the node inside that network namespace
instead, on the host's address: node name ``name@<address>`` (long names), AMQP and
distribution listeners and epmd on that address, ``guest`` allowed from other hosts (there is
no other way in), and ``rabbitmqctl`` run inside the namespace too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from consumer.tools import demo_support

if TYPE_CHECKING:
    from tests.rigs.netns import Host

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
CTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"
# Erlang/OTP's C client of the distribution protocol: evaluates an expression on a node without
# booting an Erlang VM of its own (:meth:`RabbitNode.erl`)
ERL_CALL = "/usr/lib/erlang/bin/erl_call"
_RESERVED = set(range(5790, 5800)) | set(range(25790, 25800))


def available() -> bool:
    """True when the RabbitMQ server binaries are installed here."""
    return (
        Path(SERVER).exists()
        and Path(CTL).exists()
        and Path(ERL_CALL).exists()
        and shutil.which("erl") is not None
    )


def _caller() -> str:
    """A name for one erl_call's hidden node that no other call has. ``-r`` named it ``c`` and
    the second modulo 997, so calls in one second shared a name, and a node refuses a
    connection under a name it still holds (a call that just ended, on a busy node)."""
    return f"brcall{secrets.token_hex(8)}"


class ErlCallError(RuntimeError):
    """The node gave no result: not reachable, or the expression failed there."""


# An Erlang term as JSON: atoms as strings (true and false as booleans), a resource (a queue's
# name) as its name, anything else printed. The result travels as hex digits in a string, which
# erl_call prints whole (it abbreviates a binary).
_AS_JSON = (
    "J = fun J(V) when is_boolean(V) -> V; J(V) when is_atom(V) -> atom_to_binary(V); "
    "J(V) when is_binary(V); is_number(V) -> V; J(V) when is_list(V) -> [J(X) || X <- V]; "
    "J({resource, _, _, Name}) -> Name; "
    "J(V) when is_map(V) -> maps:from_list([{J(K), J(X)} || {K, X} <- maps:to_list(V)]); "
    'J(V) -> iolist_to_binary(io_lib:format("~p", [V])) end, '
    "binary_to_list(binary:encode_hex(iolist_to_binary(rabbit_json:encode("
    "J(begin @EXPRESSION@ end))))).\n"
)
_RESULT = re.compile(r'^\{ok, "([0-9A-F]*)"\}\s*$')


def free_port() -> int:
    """A free TCP port on 127.0.0.1, outside the ranges reserved for other checks and below
    the kernel's range for port 0 (consumer/tools/demo_support.py)."""
    while True:
        port = demo_support.free_port()
        if port not in _RESERVED:
            return port


def new_cookie() -> str:
    return secrets.token_hex(16).upper()


@dataclass
class RabbitNode:
    """One RabbitMQ node under ``base_dir``; ``config`` is extra rabbitmq.conf text."""

    name: str
    base_dir: Path
    amqp_port: int = field(default_factory=free_port)
    dist_port: int = field(default_factory=free_port)
    cookie: str = field(default_factory=new_cookie)
    config: str = ""
    listen_plain: bool = True
    host: Host | None = None  # in this network namespace, on its address (tests/rigs/netns.py)
    # plugins enabled at boot (its enabled_plugins file), e.g. ("rabbitmq_random_exchange",)
    plugins: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return self.host.address if self.host is not None else "127.0.0.1"

    @property
    def node(self) -> str:
        return f"{self.name}@{self.address if self.host is not None else 'localhost'}"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.address}:{self.amqp_port}/"

    def _argv(self, cmd: list[str]) -> list[str]:
        return self.host.argv(cmd) if self.host is not None else cmd

    @property
    def home(self) -> Path:
        return self.base_dir / "home"

    @property
    def log_file(self) -> Path:
        return self.base_dir / "console.log"

    def _prepare(self) -> None:
        for sub in ("home", "mnesia", "log"):
            (self.base_dir / sub).mkdir(parents=True, exist_ok=True)
        cookie = self.home / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(self.cookie)
            cookie.chmod(0o400)
        (self.base_dir / "rabbitmq-env.conf").write_text("")
        (self.base_dir / "enabled_plugins").write_text(f"[{','.join(self.plugins)}].\n")
        lines = [
            # guest may log in from loopback only, which is where the tests are (in a
            # namespace of its own a node is reached from other hosts' addresses only)
            "loopback_users.guest = true" if self.host is None else "loopback_users = none",
            "log.console = true",
            "log.console.level = warning",
            "log.file = false",
        ]
        if self.listen_plain:
            lines.insert(0, f"listeners.tcp.default = {self.address}:{self.amqp_port}")
        else:
            lines.insert(0, "listeners.tcp = none")
        (self.base_dir / "rabbitmq.conf").write_text("\n".join(lines) + "\n" + self.config)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(self.home),
            RABBITMQ_CONF_ENV_FILE=str(self.base_dir / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(self.base_dir / "rabbitmq.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.base_dir / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(self.base_dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.base_dir / "log"),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS=self.address,
            RABBITMQ_NODE_PORT=str(self.amqp_port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RUNNING_UNDER_SYSTEMD="1",
            ERL_EPMD_ADDRESS=self.address,  # epmd adds the loopback itself
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=(
                f"-kernel inet_dist_use_interface {{{self.address.replace('.', ',')}}}"
            ),
        )
        if self.host is not None:
            env["RABBITMQ_USE_LONGNAME"] = "true"
        return env

    def start(self, timeout: float = 90) -> RabbitNode:
        """Start the node and wait until it accepts AMQP connections (if it listens in plain)."""
        assert self.proc is None or self.proc.poll() is not None, "node already running"
        self._prepare()
        with self.log_file.open("ab") as log:
            self.proc = subprocess.Popen(
                self._argv([SERVER]),
                env=self.env(),
                cwd=self.base_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"node {self.node} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            # while the AMQP port is still closed the node is surely booting: poll the port,
            # which costs nothing, then ask the node
            booting = self.listen_plain and not self._port_open()
            if not booting and self.booted():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {self.node} not ready in {timeout} s:\n{self.log_tail()}")
            time.sleep(0.2 if booting else 0.5)

    def _port_open(self) -> bool:
        if self.host is not None:
            return self.host.port_open(self.amqp_port)
        try:
            with socket.create_connection(("127.0.0.1", self.amqp_port), timeout=1):
                return True
        except OSError:
            return False

    def ctl(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run ``rabbitmqctl -n <node> ARGS`` against this node."""
        result = subprocess.run(
            self._argv([CTL, "-n", self.node, *args]),
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"rabbitmqctl {' '.join(args)} on {self.node} failed: "
                f"{result.stdout}{result.stderr}"
            )
        return result

    def erl(self, expression: str, *, timeout: float = 30) -> Any:
        """The value of the Erlang ``expression`` (no final dot) evaluated on the node, as JSON
        (atoms as strings, a queue's name as its name), with ``erl_call``: a C client of the
        distribution protocol, as rabbitmqctl's own calls are, but without the Erlang VM
        rabbitmqctl boots for each call (0.6 to 1 CPU-s, and seconds of wall time on a busy
        machine, where the rigs poll a node several times a second). ErlCallError when the node
        does not answer or the expression fails; TimeoutExpired after ``timeout`` s."""
        names = "-name" if self.host is not None else "-sname"  # long names in a namespace
        result = subprocess.run(
            self._argv([ERL_CALL, names, self.node, "-c", self.cookie, "-h", _caller(), "-e"]),
            input=_AS_JSON.replace("@EXPRESSION@", expression),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        found = _RESULT.match(result.stdout)
        if result.returncode != 0 or found is None:
            raise ErlCallError(
                f"{expression} on {self.node}: {result.stdout.strip()} {result.stderr.strip()}"
            )
        return json.loads(bytes.fromhex(found.group(1)))

    def erl_ok(self, expression: str, *, timeout: float = 60) -> None:
        """Evaluate ``expression``, which must return ``ok`` (RuntimeError otherwise): what
        rabbitmqctl's stop_app (``rabbit:stop()``), start_app (``rabbit:start()``) and
        join_cluster (``rabbit_mnesia:join_cluster(Seed, disc)``) call on the node."""
        result = self.erl(expression, timeout=timeout)
        if result != "ok":
            raise RuntimeError(f"{expression} on {self.node}: {result}")

    def booted(self) -> bool:
        """Whether the node has finished booting the rabbit application (what ``rabbitmqctl
        await_startup`` waits for); False while it boots or gives no answer."""
        try:
            return self.erl("rabbit:is_booted()", timeout=10) is True
        except (ErlCallError, subprocess.TimeoutExpired):
            return False

    def _while_running(self, expression: str, timeout: float) -> Any:
        """``expression``'s value, or ErlCallError while the node's rabbit application is not
        running: rabbitmqctl's listing commands refuse then too (a booting node's Mnesia would
        still answer, and list it as running)."""
        value = self.erl(
            f"case rabbit:is_running() of false -> not_running; true -> {expression} end",
            timeout=timeout,
        )
        if value == "not_running":
            raise ErlCallError(f"the rabbit application is not running on {self.node}")
        return value

    def cluster_status(self, *, timeout: float = 30) -> dict[str, Any]:
        """The cluster as this node sees it, as ``rabbitmqctl cluster_status --formatter json``
        reports it: ``running_nodes`` and ``partitions`` (each node with the nodes it saw
        partitioned from it). ErlCallError while the node's rabbit application is not running
        (booting, paused in a minority, stuck on its way back), where rabbitmqctl refuses too:
        its Mnesia may answer meanwhile, and list the node as running."""
        status: dict[str, Any] = self._while_running(
            "S = rabbit_mnesia:status(), maps:from_list([{K, case K of partitions -> "
            "maps:from_list(V); _ -> V end} || {K, V} <- S, K =/= nodes])",
            timeout,
        )
        return status

    def queue_rows(
        self, *items: str, vhost: str = "/", timeout: float = 30
    ) -> list[dict[str, Any]]:
        """Every queue of ``vhost`` with these info items (rabbitmqctl list_queues's: name,
        type, leader, members, online, messages_ready, consumers, ...), as ``list_queues
        --formatter json`` gives them: each running node reports the queues it leads (a quorum
        queue's counts live on its leader's node), then this node the durable ones that are
        down. A queue whose process ends while it is asked (deleted, its owner gone) is left
        out, with rabbitmqctl's own exit handler. ErlCallError while the node's rabbit
        application is not running, where rabbitmqctl refuses too."""
        keys = ", ".join(items)
        rows: list[dict[str, Any]] = self._while_running(
            f'Items = [{keys}], VHost = <<"{vhost}">>, '
            "Local = lists:append([erpc:call(N, fun() -> lists:append(["
            "rabbit_misc:with_exit_handler(fun() -> [] end, "
            "fun() -> [rabbit_amqqueue:info(Q, Items)] end) "
            "|| Q <- rabbit_amqqueue:list_local(VHost)]) end, 20000) "
            "|| N <- rabbit_nodes:all_running()]), "
            "Down = [rabbit_amqqueue:info_down(Q, Items, down) "
            "|| Q <- rabbit_amqqueue:list_down(VHost)], "
            "[maps:from_list(I) || I <- Local ++ Down]",
            timeout,
        )
        return rows

    def join(self, other: RabbitNode) -> None:
        """Join ``other``'s cluster (both must share the cookie)."""
        self.erl_ok("rabbit:stop()")
        self.erl_ok(f"rabbit_mnesia:join_cluster('{other.node}', disc)")
        self.erl_ok("rabbit:start()", timeout=120)  # returns once the app has booted

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the broker: no goodbye to clients or to the cluster."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 60) -> None:
        """Orderly stop; SIGKILL if it does not stop in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        # the Erlang VM may leave helpers (erl_child_setup, inet_gethost) in its session
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_file.exists():
            return ""
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> RabbitNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
