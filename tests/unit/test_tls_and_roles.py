"""Pure logic of TLS failures, TLS file settings and role prefixes (no servers needed)."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiormq
import pytest

from bulk_recorder.infra.roles import role_names
from bulk_recorder.infra.tls import amqp_uses_tls, pg_uses_tls, tls_error, tls_failure_line
from settings import SettingsError, load_settings


def _verify_error(message: str) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(
        1, f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: {message} (_ssl.c:1006)"
    )
    error.verify_message = message
    return error


def test_a_verification_failure_names_the_setting_server_and_ca_file() -> None:
    dsn = "postgresql://u:pw@db:5432/x?sslmode=verify-full&sslrootcert=/etc/ca.crt"
    line = tls_failure_line(
        "DATABASE_URL", "PostgreSQL", "db:5432/x", dsn, _verify_error("unable to get issuer")
    )
    assert line == (
        "DATABASE_URL: PostgreSQL at db:5432/x presented a certificate that TLS verification "
        "refused (certificate verify failed: unable to get issuer); DATABASE_URL trusts "
        "sslrootcert=/etc/ca.crt"
    )
    assert "pw" not in line.replace("PostgreSQL", "")


def test_aiormq_wrapping_of_the_ssl_error_is_seen_through() -> None:
    cause = _verify_error("self-signed certificate in certificate chain")
    # as aiormq's TLS transport does: raise AMQPConnectionError(*e.args) from e
    wrapped = aiormq.exceptions.AMQPConnectionError(*cause.args)
    wrapped.__cause__ = cause
    assert tls_error(wrapped) is cause
    line = tls_failure_line(
        "RABBITMQ_URL", "RabbitMQ", "mq:5671/", "amqps://u:p@mq:5671/?cafile=/ca", wrapped
    )
    assert line.startswith("RABBITMQ_URL: RabbitMQ at mq:5671/ presented a certificate")
    assert line.endswith("RABBITMQ_URL trusts cafile=/ca")


def test_a_handshake_failure_other_than_verification_is_named_too() -> None:
    error = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)")
    line = tls_failure_line("RABBITMQ_URL", "RabbitMQ", "mq:5672/", "amqps://mq:5672/", error)
    assert line == (
        "RABBITMQ_URL: TLS with RabbitMQ at mq:5672/ failed (wrong version number); "
        "is it a TLS port?"
    )


def test_errors_without_tls_are_no_tls_failure() -> None:
    assert tls_error(ConnectionRefusedError(111, "refused")) is None
    assert tls_failure_line("DATABASE_URL", "PostgreSQL", "h", "postgresql://h/x", OSError()) == ""


@pytest.mark.parametrize(
    ("dsn", "encrypted"),
    [
        ("postgresql://h/x", False),
        ("postgresql://h/x?sslmode=prefer", False),
        ("postgresql://h/x?sslmode=require", True),
        ("postgresql://h/x?sslmode=verify-full&sslrootcert=/c", True),
    ],
)
def test_which_database_urls_use_tls(dsn: str, encrypted: bool) -> None:
    assert pg_uses_tls(dsn) is encrypted


def test_which_broker_urls_use_tls() -> None:
    assert amqp_uses_tls("amqps://h/")
    assert not amqp_uses_tls("amqp://h/")


@pytest.mark.parametrize(
    ("field", "url"),
    [
        ("database_url", "postgresql://u:secret@h/x?sslmode=verify-full&sslrootcert={missing}"),
        ("rabbitmq_url", "amqps://u:secret@h:5671/?cafile={missing}"),
        (
            "rabbitmq_url",
            "amqps://u:secret@a:5671/?cafile={ca},amqps://u:secret@b/?cafile={missing}",
        ),
    ],
)
def test_a_missing_ca_file_is_a_bad_setting_naming_the_variable(
    tmp_path: Path, field: str, url: str
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("not checked here")
    missing = tmp_path / "nope.crt"
    with pytest.raises(SettingsError) as caught:
        load_settings(**{field: url.format(ca=ca, missing=missing)})
    message = str(caught.value)
    assert field.upper() in message
    assert f"={missing} is not a readable file" in message
    assert "secret" not in message


def test_existing_ca_files_are_accepted(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    s = load_settings(
        database_url=f"postgresql://h/x?sslmode=verify-full&sslrootcert={ca}",
        rabbitmq_url=f"amqps://h:5671/?cafile={ca}",
    )
    assert s.rabbitmq_url.endswith(str(ca))


def test_role_names_from_a_prefix() -> None:
    assert role_names("myapp") == ("myapp_recorder", "myapp_relay", "myapp_api")


@pytest.mark.parametrize("prefix", ["", "MyApp", "1app", "my-app", "a;drop", "x" * 55])
def test_a_prefix_that_would_need_quoting_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="lower-case identifier"):
        role_names(prefix)
