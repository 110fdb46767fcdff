"""TLS for the tests: a throwaway CA and server certificate, and servers that speak only TLS.

:func:`make_pki` runs ``openssl`` to make two self-signed CAs (``ca`` and ``other_ca``) and one
server certificate signed by ``ca`` for ``127.0.0.1`` and ``localhost`` (ECDSA P-256, valid for
two days). A client that trusts ``ca`` accepts the servers; one that trusts ``other_ca`` meets a
server certificate from another CA and must refuse it.

:func:`tls_rabbit_node` is a :class:`~tests.rigs.rabbitmq_node.RabbitNode` with a TLS listener
and no plain one; :class:`TlsPgServer` is a PostgreSQL 15 server with ``ssl = on`` whose
``pg_hba.conf`` admits ``hostssl`` connections only, so that nothing can reach either server in
plain TCP. Both listen on 127.0.0.1, on free ports outside the reserved ranges. Nothing of the
machine's own servers is read or touched.

Every function blocks; from async tests call the slow ones through ``asyncio.to_thread``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.rigs.postgres_server import DB_USER, OS_USER, PG_BIN, PgServer, as_server_user, run
from tests.rigs.rabbitmq_node import RabbitNode, free_port

SERVER_NAMES = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class Pki:
    folder: Path
    ca_cert: Path  # the CA that signed the servers' certificate
    other_ca_cert: Path  # a CA that signed nothing the servers present
    server_cert: Path
    server_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stdout}{result.stderr}")


def _self_signed_ca(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.crt"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key.name, "-out", cert.name, "-days", "2",
        "-subj", f"/CN=bulk-recorder test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-addext", "subjectKeyIdentifier=hash",
        cwd=folder,
    )  # fmt: skip
    return key, cert


def make_pki(folder: Path) -> Pki:
    """Two CAs and a server certificate from the first, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _self_signed_ca(folder, "ca")
    _, other_ca_cert = _self_signed_ca(folder, "other_ca")
    alt_names = ",".join(
        f"IP:{n}" if n.replace(".", "").isdigit() else f"DNS:{n}" for n in SERVER_NAMES
    )
    (folder / "server.ext").write_text(
        f"subjectAltName={alt_names}\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyAgreement\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", f"/CN={SERVER_NAMES[0]}",
        cwd=folder,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", ca_cert.name, "-CAkey", ca_key.name,
        "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "server.ext",
        cwd=folder,
    )  # fmt: skip
    for path in folder.iterdir():
        path.chmod(0o600 if path.suffix == ".key" else 0o644)
    return Pki(folder, ca_cert, other_ca_cert, folder / "server.crt", folder / "server.key")


# -- RabbitMQ -----------------------------------------------------------------------------------


@dataclass
class TlsRabbit:
    node: RabbitNode
    tls_port: int

    def url(self, cafile: Path, *, user: str = "guest", password: str = "guest") -> str:
        """``amqps://`` URL to the TLS listener that trusts ``cafile`` (hostname checked)."""
        return f"amqps://{user}:{password}@127.0.0.1:{self.tls_port}/?cafile={cafile}"


def tls_rabbit_node(base_dir: Path, pki: Pki) -> TlsRabbit:
    """A RabbitMQ node listening in TLS only (not started)."""
    tls_port = free_port()
    config = f"""
listeners.ssl.default = 127.0.0.1:{tls_port}
ssl_options.cacertfile = {pki.ca_cert}
ssl_options.certfile = {pki.server_cert}
ssl_options.keyfile = {pki.server_key}
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
"""
    # a name of its own: two pytest processes (a mutant's and the baseline's) may each run one
    node = RabbitNode(f"brtls{uuid.uuid4().hex[:8]}", base_dir, config=config, listen_plain=False)
    return TlsRabbit(node, tls_port)


# -- PostgreSQL ---------------------------------------------------------------------------------


@dataclass
class TlsPgServer:
    """A PostgreSQL 15 server with ``ssl = on`` that refuses connections without TLS."""

    base_dir: Path
    pki: Pki
    work_dir: Path = field(init=False)
    server: PgServer = field(init=False)

    def __post_init__(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:  # PostgreSQL refuses root: its files belong to the postgres user
            user = pwd.getpwnam(OS_USER)
            self.work_dir = Path(tempfile.mkdtemp(prefix="br-pgtls-"))
            os.chown(self.work_dir, user.pw_uid, user.pw_gid)
        else:
            self.work_dir = Path(tempfile.mkdtemp(prefix="pgtls-", dir=self.base_dir))
        self.server = PgServer("tls", self.work_dir / "data")

    @property
    def port(self) -> int:
        return self.server.port

    def dsn(self, database: str, rootcert: Path, *, user: str = DB_USER) -> str:
        """``sslmode=verify-full`` DSN that trusts ``rootcert``."""
        return (
            f"postgresql://{user}@127.0.0.1:{self.port}/{database}"
            f"?sslmode=verify-full&sslrootcert={rootcert}"
        )

    def start(self) -> TlsPgServer:
        try:
            self._init()
            self.server.start()
        except BaseException:
            self.stop()
            raise
        return self

    def _init(self) -> None:
        data = self.server.data_dir
        run(
            as_server_user(
                [
                    str(PG_BIN / "initdb"), "-D", str(data), "-U", DB_USER, "-A", "trust",
                    "-E", "UTF8", "--no-sync", "--no-instructions",
                ]
            ),
            "initdb",
        )  # fmt: skip
        for source, name in (
            (self.pki.server_cert, "server.crt"),
            (self.pki.server_key, "server.key"),
        ):
            self._write(data / name, source.read_text(), mode=0o600)
        conf = data / "postgresql.conf"
        self._write(
            conf,
            conf.read_text()
            + f"""
# bulk-recorder TLS rig
listen_addresses = '127.0.0.1'
port = {self.port}
unix_socket_directories = ''
shared_buffers = 32MB
fsync = off
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
""",
        )
        # TLS only: a plain TCP connection finds no pg_hba.conf line and is refused
        self._write(data / "pg_hba.conf", "hostssl all all 127.0.0.1/32 trust\n")

    @staticmethod
    def _write(path: Path, text: str, mode: int = 0o600) -> None:
        owner = path.parent.stat()
        path.write_text(text)
        path.chmod(mode)
        if os.geteuid() == 0:
            os.chown(path, owner.st_uid, owner.st_gid)

    def stop(self) -> None:
        self.server.stop()
        if self.server.log_file.exists():
            shutil.copyfile(self.server.log_file, self.base_dir / self.server.log_file.name)
        shutil.rmtree(self.work_dir, ignore_errors=True)
