"""TLS to RabbitMQ and PostgreSQL, configured in the URL settings alone, and its failures.

Nothing here builds an SSL context: both drivers build theirs from the URL.

- ``RABBITMQ_URL``: ``amqps://user:pw@host:5671/vhost?cafile=/path/ca.crt`` (aiormq reads
  ``cafile``, ``capath``, ``certfile`` and ``keyfile`` from the query; the server's certificate
  and its host name are always checked, unless ``no_verify_ssl=1``, which we never advise).
- ``DATABASE_URL``: ``postgresql://user@host/db?sslmode=verify-full&sslrootcert=/path/ca.crt``
  (asyncpg reads the libpq parameters ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``).

A certificate that fails verification is a setting to fix, not an outage to wait out: this
module finds such a failure in what the drivers raise and words it as one line that names the
setting and the CA file it gave.
"""

from __future__ import annotations

import ssl
from urllib.parse import parse_qs, urlsplit

# libpq's sslmode values that encrypt whatever the server says (prefer and allow may fall back
# to plain TCP, so a check of ours would prove nothing with them).
PG_TLS_MODES = frozenset({"require", "verify-ca", "verify-full"})


def _query(url: str) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(urlsplit(url).query).items()}


def amqp_uses_tls(url: str) -> bool:
    return url.strip().startswith("amqps://")


def pg_uses_tls(dsn: str) -> bool:
    return _query(dsn).get("sslmode", "") in PG_TLS_MODES


def tls_error(exc: BaseException) -> ssl.SSLError | None:
    """The :class:`ssl.SSLError` behind ``exc`` (itself, or in its cause/context chain)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    # aiormq copies the SSL error's args into its own AMQPConnectionError: (1, "[SSL: ...] ...")
    if any(isinstance(arg, str) and arg.startswith("[SSL") for arg in exc.args):
        return ssl.SSLError(*exc.args)
    return None


def _why(error: ssl.SSLError) -> str:
    if isinstance(error, ssl.SSLCertVerificationError) and error.verify_message:
        return f"certificate verify failed: {error.verify_message}"
    text = str(error.args[1] if len(error.args) > 1 else error)
    return text.split("] ", 1)[-1].split(" (_ssl.c")[0]


def tls_failure_line(setting: str, service: str, where: str, url: str, exc: BaseException) -> str:
    """One line for a TLS failure of ``exc``, or "" when ``exc`` is no TLS failure.

    Names the setting, the server and the CA file the setting gave (never a password).
    """
    error = tls_error(exc)
    if error is None:
        return ""
    parameter = "cafile" if setting == "RABBITMQ_URL" else "sslrootcert"
    ca_file = _query(url).get(parameter)
    trusted = f"{parameter}={ca_file}" if ca_file else f"no {parameter} (the system's CAs)"
    if isinstance(error, ssl.SSLCertVerificationError):
        return (
            f"{setting}: {service} at {where} presented a certificate that TLS verification "
            f"refused ({_why(error)}); {setting} trusts {trusted}"
        )
    return f"{setting}: TLS with {service} at {where} failed ({_why(error)}); is it a TLS port?"
