"""No piece of a password leaves through what a check says about a URL it cannot read.

Two ways it did: a URL setting with no scheme (``app:pw@h1/``) was echoed, in part or whole,
where masking cannot recognise a URL; and a password holding ``/``, ``?`` or ``#`` ends the
URL's host part early, so the parsers (urllib, asyncpg, http.client) quote the part of the
password before that character as a port, or the part after it as a query. Every piece of four
characters of the password is looked for, not only the whole. In-process; the real CLI is
``tests/integration/test_log_safety.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bulk_recorder.exceptions import EXIT_SETTINGS
from bulk_recorder.infra import pg_hosts, reach
from bulk_recorder.infra.broker import BrokerNodes
from bulk_recorder.masking import masked
from bulk_recorder.url_checks import UnreadableUrl
from settings import SettingsError, load_settings

URL_VARIABLES = ("DATABASE_URL", "RABBITMQ_URL", "DATABASE_URL_FILE", "RABBITMQ_URL_FILE")


def pieces(password: str) -> set[str]:
    """Every piece of four characters of ``password``."""
    return {password[i : i + 4] for i in range(len(password) - 3)}


def assert_no_piece(text: str, password: str) -> None:
    shown = sorted(piece for piece in pieces(password) if piece in text)
    assert not shown, f"{shown} of {password!r} in: {text}"


def assert_unchained(exc: BaseException) -> None:
    """The parser's error is not in ``exc``'s chain (a traceback would print its text)."""
    assert exc.__cause__ is None, repr(exc.__cause__)
    assert exc.__context__ is None or exc.__suppress_context__, repr(exc.__context__)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in URL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def refused(env: pytest.MonkeyPatch, tmp_path: Path, name: str, value: str) -> str:
    """The settings error for ``name`` set to ``value`` (a ``*_FILE`` gets a file holding it)."""
    if name.endswith("_FILE"):
        (tmp_path / "secret").write_text(value + "\n")
        env.setenv(name, str(tmp_path / "secret"))
    else:
        env.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith(f"invalid settings: {name}:"), message
    assert len(message.splitlines()) == 1, message
    return message


PLAIN = "Xq7pZk9wLm2v"  # no character a URL gives a meaning to

NO_SCHEME = [
    ("RABBITMQ_URL", "app:{pw}@h1/"),  # the reported form: its first 20 characters were echoed
    ("RABBITMQ_URL", "app:{pw}"),
    ("RABBITMQ_URL", "amqp//app:{pw}@h1/"),
    ("RABBITMQ_URL", "amqp:app:{pw}@h1/"),
    ("RABBITMQ_URL", "amqp://h0/,app:{pw}@h1/"),
    ("RABBITMQ_URL", "app:{pw}@h1/,amqp://h2/"),
    ("RABBITMQ_URL_FILE", "app:{pw}"),
    ("RABBITMQ_URL_FILE", "amqp://h0/, app:{pw}@h1/"),
    ("DATABASE_URL", "app:{pw}@db/x"),
    ("DATABASE_URL", "app:{pw}"),
    ("DATABASE_URL", "postgresql//app:{pw}@db/x"),
    ("DATABASE_URL", "postgresql:app:{pw}@db/x"),
    ("DATABASE_URL_FILE", "app:{pw}"),
    ("DATABASE_URL_FILE", "postgres//app:{pw}@db/x"),
]


@pytest.mark.parametrize(("name", "template"), NO_SCHEME)
def test_a_url_setting_without_its_scheme_is_never_echoed(
    env: pytest.MonkeyPatch, tmp_path: Path, name: str, template: str
) -> None:
    message = refused(env, tmp_path, name, template.format(pw=PLAIN))
    assert "postgresql://" in message or "amqp://" in message, message
    assert_no_piece(message, PLAIN)


def test_a_url_settings_wrong_scheme_is_named_and_its_value_shown_masked(
    env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A scheme masking recognises: the scheme is named, the value shown with ``***``."""
    message = refused(env, tmp_path, "RABBITMQ_URL", f"http://app:{PLAIN}@h1/")
    assert "('http')" in message, message
    assert "http://app:***@h1/" in message, message
    assert_no_piece(message, PLAIN)


# (variable, URL with {pw}, password): each password holds what ends a URL's host part
CUT_PASSWORDS = [
    ("RABBITMQ_URL", "amqp://app:{pw}@h1/", "Xq7p/Zk9w"),
    ("RABBITMQ_URL", "amqp://app:{pw}@h1/", "Xq7p?Zk9w"),
    ("RABBITMQ_URL", "amqp://app:{pw}@h1/", "Xq7p#Zk9w"),
    ("RABBITMQ_URL", "amqp://app:{pw}@h1/", "Xq7p:Zk/9w"),
    ("RABBITMQ_URL", "amqp://app:{pw}@h1/", "7319/Zk9wLm"),  # a number before the /: a port
    ("RABBITMQ_URL", "amqp://app:{pw}@h1/", "7319?Zk9wLm"),
    ("RABBITMQ_URL", "amqp://app:{pw}@h1/", "7319#Zk9wLm"),
    ("RABBITMQ_URL", "amqp://app:{pw}@h1:5672/v", "99999/Zk9wLm"),  # a port out of range
    ("RABBITMQ_URL", "amqp://h0/,amqp://app:{pw}@h1/", "Xq7p/Zk9w"),
    ("RABBITMQ_URL_FILE", "amqp://app:{pw}@h1/,amqp://h2/", "Xq7p?Zk9w"),
    ("DATABASE_URL", "postgresql://app:{pw}@db/x", "Xq7p/Zk9w"),
    ("DATABASE_URL", "postgresql://app:{pw}@db/x", "Xq7p?Zk9w"),
    ("DATABASE_URL", "postgresql://app:{pw}@db/x", "Xq7p#Zk9w"),
    ("DATABASE_URL", "postgres://app:{pw}@db1:5432,db2/x", "Xq7p:Zk#9w"),
    ("DATABASE_URL", "postgresql://app:{pw}@db/x", "7319/Zk9wLm"),
    ("DATABASE_URL", "postgresql://app:{pw}@db/x", "7319?Zk9wLm"),  # asyncpg: "bad query field"
    ("DATABASE_URL", "postgresql://app:{pw}@db/x", "7319#Zk9wLm"),
    ("DATABASE_URL_FILE", "postgresql://app:{pw}@db/x?sslmode=disable", "Xq7p?Zk9w"),
]


@pytest.mark.parametrize(("name", "template", "password"), CUT_PASSWORDS)
def test_a_password_holding_a_slash_query_or_hash_is_refused_in_our_words(
    env: pytest.MonkeyPatch, tmp_path: Path, name: str, template: str, password: str
) -> None:
    message = refused(env, tmp_path, name, template.format(pw=password))
    assert "must be percent-encoded" in message, message
    assert_no_piece(message, password)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RABBITMQ_URL", "amqp://app:Xq7p:Zk9w@h1/"),
        ("RABBITMQ_URL", "amqp://app:Xq7p%2FZk9w@h1:5672/v?heartbeat=30"),
        ("DATABASE_URL", "postgresql://app:Xq7p:Zk9w@db/x"),
        ("DATABASE_URL", "postgresql://app:Xq7p%3FZk9w@db1:5432,db2/x?user=app@srv"),
    ],
)
def test_a_colon_or_a_percent_encoded_password_is_taken(
    env: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """A ``:`` in the password is the drivers' too (the first ``:`` ends the user); an ``@`` in
    a query parameter (a user ``app@srv``) is not taken for a cut password."""
    env.setenv(name, value)
    assert getattr(load_settings(), name.lower()) == value


@pytest.mark.parametrize(
    ("port", "taken"), [("65534", True), ("65535", True), ("65536", False), ("5x", False)]
)
@pytest.mark.parametrize(
    ("name", "template"),
    [("RABBITMQ_URL", "amqp://h1:{port}/"), ("DATABASE_URL", "postgresql://db1:5432,db2:{port}/x")],
)
def test_a_port_is_a_number_up_to_65535(
    env: pytest.MonkeyPatch, tmp_path: Path, name: str, template: str, port: str, taken: bool
) -> None:
    value = template.format(port=port)
    if taken:
        env.setenv(name, value)
        assert getattr(load_settings(), name.lower()) == value
    else:
        assert "port is not a number from 0 to 65535" in refused(env, tmp_path, name, value)


# -- the call sites: a URL no setting checked (or one the drivers read otherwise) ----------


@pytest.mark.parametrize(
    ("dsn", "password"),
    [
        ("postgresql://app:{pw}@127.0.0.1:1/x", "Xq7p/Zk9w"),  # int() of the port
        ("postgresql://app:{pw}@127.0.0.1:1/x", "7319?Zk9wLm"),  # the strict query parse
        ("postgresql://app:{pw}@127.0.0.1:1/x", "Zk@9w:Xq7p"),  # asyncpg splits at the first @
    ],
)
async def test_a_database_url_asyncpg_cannot_read_is_named_not_quoted(
    dsn: str, password: str
) -> None:
    url = dsn.format(pw=password)
    for check in (pg_hosts.connect, reach.check_database):
        with pytest.raises(UnreadableUrl) as caught:
            await check(url)
        assert getattr(caught.value, "exit_code", None) == EXIT_SETTINGS, repr(caught.value)
        assert str(caught.value).startswith("invalid settings: DATABASE_URL:"), caught.value
        assert "must be percent-encoded" in str(caught.value)
        assert_unchained(caught.value)
        assert_no_piece(str(caught.value), password)


async def test_a_node_aio_pika_cannot_read_is_named_not_quoted() -> None:
    password = "Xq7p?Zk9w"
    url = f"amqp://127.0.0.1:1/,amqp://app:{password}@127.0.0.1:1/"
    for connect in (BrokerNodes.from_setting(url).connect, lambda: reach.check_broker(url)):
        with pytest.raises(UnreadableUrl) as caught:
            await connect()
        assert getattr(caught.value, "exit_code", None) == EXIT_SETTINGS, repr(caught.value)
        assert str(caught.value).startswith("invalid settings: RABBITMQ_URL:"), caught.value
        assert_unchained(caught.value)
        assert_no_piece(str(caught.value), password)


def test_a_value_error_is_given_in_our_words_by_reach_and_failure_lines() -> None:
    """``reason()`` words the one-line failures of ``reach`` and ``consumer.failures``."""
    for text in ("invalid literal for int() with base 10: 'Xq7p'", "bad query field: 'Xq7p@db'"):
        line = reach.reason(ValueError(text))
        assert "must be percent-encoded" in line, line
        assert_no_piece(line, "Xq7p")


@pytest.mark.parametrize(
    ("template", "password"),
    [
        ("http://app:{pw}@127.0.0.1:1/metrics", "Xq7p/Zk9w"),
        ("http://app:{pw}@127.0.0.1:1/metrics", "Xq7p?Zk9w"),
        ("http://app:{pw}@127.0.0.1:1/metrics", "Xq7p#Zk9w"),
        ("http://app:{pw}@127.0.0.1:1/metrics", "7319?Zk9wLm"),  # read, but not as meant
        ("app/x:{pw}@127.0.0.1:1/metrics", "Xq7pZk9wLm2v"),  # urllib: "unknown url type: '...'"
        ("//app:{pw}@127.0.0.1:1/metrics", "Xq7pZk9wLm2v"),
    ],
)
def test_tune_says_a_metrics_url_it_cannot_read_in_our_words(template: str, password: str) -> None:
    from consumer.tools.tune import TuneSourceError, _get

    with pytest.raises(TuneSourceError) as caught:
        _get(template.format(pw=password))
    assert_unchained(caught.value)
    assert "must be percent-encoded" in str(caught.value), caught.value
    assert_no_piece(masked(str(caught.value)), password)  # as the CLI prints it
