"""Every form of secret the clients accept is masked wherever a URL or DSN is printed or logged:
the userinfo password (everything from ``scheme://user:`` to the LAST ``@`` before the host,
quotes, spaces and tabs included), ``password``/``sslpassword``/``api-key``/``token``... in a
query string and ``NAME=value`` text in any case, each node of a comma-separated list, libpq's
keyword/value form; through settings errors, ``endpoint()`` and the log formatter; linear in
the text."""

from __future__ import annotations

import logging

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from bulk_recorder.masking import endpoint, masked
from settings import SettingsError, load_settings

SECRET = "s3cr3t"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("amqp://app:p@ss@h1/", "amqp://app:***@h1/"),
        ("amqp://app:p@ss@h1:5672/vh", "amqp://app:***@h1:5672/vh"),
        ("amqp://app:p/s?s#@h1/", "amqp://app:***@h1/"),
        (
            "postgresql://app@db/x?password=s3cr3t&connect_timeout=0",
            "postgresql://app@db/x?password=***&connect_timeout=0",
        ),
        ("postgresql://app@db/x?sslpassword=s3cr3t", "postgresql://app@db/x?sslpassword=***"),
        ("postgresql://app@db/x?pass%77ord=s3cr3t", "postgresql://app@db/x?pass%77ord=***"),
        (
            "postgresql://app:s3cr3t@db1:5433,db2/x?sslmode=require",
            "postgresql://app:***@db1:5433,db2/x?sslmode=require",
        ),
        ("amqp://a:s3cr3t@h1/,amqp://b:p@ss@h2/", "amqp://a:***@h1/,amqp://b:***@h2/"),
        ("postgresql://db/x?user=a@b", "postgresql://db/x?user=a@b"),
        ("postgresql://app@db/x", "postgresql://app@db/x"),
        ("host=db password=s3cr3t dbname=x", "host=db password=*** dbname=x"),
        ("host=db password='s3 cr3t' dbname=x", "host=db password=*** dbname=x"),
        ("app:s3cr3t@db/x", "app:***@db/x"),
        # a password holding a quote, a space, a tab: the URL does not end there
        ("postgresql://app:it's-s3cr3t@db/x", "postgresql://app:***@db/x"),
        (
            """(got "postgresql://app:it's-s3cr3t@db/x?connect_timeout=0")""",
            """(got "postgresql://app:***@db/x?connect_timeout=0")""",
        ),
        (
            """(got 'amqp://app:pw"s3cr3t@h1/,amqp://app:pw"s3cr3t@h2:0/')""",
            """(got 'amqp://app:***@h1/,amqp://app:***@h2:0/')""",
        ),
        ("postgresql://app:two s3cr3t@db/x", "postgresql://app:***@db/x"),
        ("postgresql://app:t\ts3cr3t@db/x", "postgresql://app:***@db/x"),
        ("'postgresql://app:a\\'b\"s3cr3t@db/x'", "'postgresql://app:***@db/x'"),
        ("amqp://app:p%40s3cr3t@h1/", "amqp://app:***@h1/"),
        ("amqp://app:a://s3cr3t@h1/", "amqp://app:***@h1/"),
        ("amqp://app:x@y://s3cr3t@h1/", "amqp://app:***@h1/"),
        (
            "amqp://app:x;y://s3cr3t@h1/ and http://c:4318/v1",
            "amqp://app:***@h1/ and http://c:4318/v1",
        ),
        ("amqp://app:a b@h1/,amqp://app:c' d@h2/", "amqp://app:***@h1/,amqp://app:***@h2/"),
        ("postgresql://app@db/x?password=it's s3cr3t", "postgresql://app@db/x?password=***"),
        ('host=db password="s3 cr3t" dbname=x', "host=db password=*** dbname=x"),
        ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
        ("at 2026-12-02 03:00:00 nothing: 10:30 ok", "at 2026-12-02 03:00:00 nothing: 10:30 ok"),
    ],
)
def test_masked_hides_every_form_of_password(raw: str, shown: str) -> None:
    assert masked(raw) == shown


def test_a_url_inside_a_message_is_masked_and_the_rest_kept() -> None:
    text = "cannot reach 'postgresql://app:p@ss@db/x?password=s3cr3t&sslmode=require' (refused)"
    assert masked(text) == (
        "cannot reach 'postgresql://app:***@db/x?password=***&sslmode=require' (refused)"
    )


def test_a_later_at_on_the_line_may_end_the_password_so_is_masked_to() -> None:
    """A password may hold a quote or a space: an ``@`` further on the line may be where it
    ends, so the text up to it is masked too (the safe side); the next line is not."""
    text = "cannot reach 'postgresql://app:p@ss@db/x' (refused) from u@h\nnext: u@h"
    assert masked(text) == "cannot reach 'postgresql://app:***@h\nnext: u@h"


@pytest.mark.parametrize(
    "text",
    [
        "cannot reach 'postgresql://app:p@ss@db/x?password=s3cr3t&sslmode=require' (refused)",
        "tracing on: spans to http://c:4318/v1/traces?api-key=s3cr3t, sampler always_on",
        "reconnecting to amqp://app:s3cr3t@h1/ as app@host, PGPASSWORD=s3cr3t x-api-key=s3cr3t",
        "app:s3cr3t@h1/ and amqp://app:it's s3cr3t@h1/,amqp://app:s3cr3t@h2/",
    ],
)
def test_masking_twice_masks_no_more_than_once(text: str) -> None:
    """The formatter masks a line whose arguments were masked already: a ``***`` is not taken
    for the start of a password that runs on to a later ``@`` or to the end of the line."""
    once = masked(text)
    assert "s3cr3t" not in once
    assert masked(once) == once


@pytest.mark.parametrize(
    "url",
    [
        "amqp://app:p@s3cr3t@h1:5672/vh",
        "amqp://app:p/s3cr3t@h1:5672/vh",
        "postgresql://app@h1:5672/vh?password=s3cr3t",
    ],
)
def test_endpoint_names_host_and_path_only(url: str) -> None:
    assert endpoint(url) == "h1:5672/vh"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DATABASE_URL", "postgresql://app@db/x?password=s3cr3t&connect_timeout=0"),
        ("DATABASE_URL", "host=db password=s3cr3t"),
        ("RABBITMQ_URL", "amqp://app:p@s3cr3t@h1:0/"),
        ("RABBITMQ_URL", "app:s3cr3t@h1/"),
        ("RABBITMQ_URL", "amqp://a:x@h1/,http://b:s3cr3t@h2/"),
        ("DATABASE_URL", "postgresql://app:it's-s3cr3t@db/x?connect_timeout=0"),
        ("DATABASE_URL", "postgresql://app:two s3cr3t@db/x?connect_timeout=0"),
        ("DATABASE_URL", "postgresql://app:t\ts3cr3t@db/x?connect_timeout=0"),
        ("DATABASE_URL", "postgresql://app:'\"s3cr3t@db/x?connect_timeout=0"),
        ("DATABASE_URL", "postgresql://app@db/x?connect_timeout=0&password=it's s3cr3t"),
        ("RABBITMQ_URL", """amqp://app:pw"s3cr3t@h1/,amqp://app:pw"s3cr3t@h2:0/"""),
        ("RABBITMQ_URL", "amqp://app:a s3cr3t@h1/,amqp://app:s3cr3t b@h2:0/"),
    ],
)
def test_a_settings_error_never_shows_the_password(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.delenv(name + "_FILE", raising=False)
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert name in str(caught.value)
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    "query", ["token=s3cr3t", "api-key=s3cr3t", "X-API-KEY=s3cr3t&x=1", "Access_Token=s3cr3t"]
)
def test_the_tracing_start_up_line_masks_the_endpoints_secrets(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, query: str
) -> None:
    from bulk_recorder.infra import tracing

    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://u:p@s3cr3t@127.0.0.1:1/v1/traces?{query}"
    )
    caplog.set_level(logging.INFO, logger="bulk_recorder.infra.tracing")
    try:
        assert tracing.configure(load_settings(), "relay")
    finally:
        tracing.shutdown()
    line = next(r.getMessage() for r in caplog.records if "tracing on" in r.getMessage())
    assert "127.0.0.1:1/v1/traces" in line
    assert "sampler" in line
    assert SECRET not in line


SECRET_NAMES = [
    "password",
    "PASSWORD",
    "Password",
    "sslpassword",
    "SSLPASSWORD",
    "SslPassword",
    "PGPASSWORD",
    "PgPassword",
    "passwd",
    "token",
    "TOKEN",
    "Token",
    "access_token",
    "ACCESS_TOKEN",
    "api-key",
    "API-KEY",
    "Api-Key",
    "api_key",
    "API_KEY",
    "apikey",
    "ApiKey",
    "x-api-key",
    "X-API-KEY",
    "X-Api-Key",
    "secret",
    "SECRET",
    "client_secret",
    "Client-Secret",
]
QUERY_FORMS = [
    "postgresql://app@db/x?{name}=s3cr3t&sslmode=require",
    "postgresql://app@db/x?sslmode=require&{name}=s3cr3t",
    "http://collector:4318/v1/traces?{name}=s3cr3t",
]
TEXT_FORMS = ["{name}=s3cr3t", "export {name}=s3cr3t; run", "host=db {name} = 's3 cr3t' dbname=x"]


@pytest.mark.parametrize(
    ("name", "form"),
    [(name, form) for name in SECRET_NAMES for form in QUERY_FORMS + TEXT_FORMS]
    + [(name, form) for name in ("pass%77ord", "PASS%57ORD") for form in QUERY_FORMS],
)
def test_a_secret_name_is_masked_in_any_case(name: str, form: str) -> None:
    """A secret query parameter or ``NAME=value``, whatever its case (upper, lower, mixed) or
    its separators (``api-key``, ``api_key``, ``apikey``), prefixed (``PGPASSWORD``,
    ``x-api-key``) or percent-encoded (in a query): the value masked, the name kept."""
    shown = masked(form.format(name=name))
    assert "3cr3t" not in shown, shown
    assert name + "=***" in shown or name + " = ***" in shown, shown


@pytest.mark.parametrize(
    "text",
    [
        "routing_key=transaction",
        "postgresql://app@db/x?sslmode=require&application_name=recorder&connect_timeout=5",
        "key=value",
        "max_tokens=5 tokens=3",
        "user=app host=db",
    ],
)
def test_a_name_that_holds_no_secret_is_shown(text: str) -> None:
    assert masked(text) == text


# -- a password holding anything, in any form, in any context ---------------------------------

MARK = "S3cr"  # put at both ends of a drawn password and in its middle: any part shown shows it
AWKWARD = "'\" \t@/#?:,;=&%+()[]*xyz019"  # none of MARK's characters


def _password(middle: tuple[str, str]) -> str:
    return MARK + middle[0] + MARK + middle[1] + MARK


_PART = st.text(alphabet=AWKWARD, max_size=8)


@given(
    middle=st.tuples(_PART, _PART),
    scheme=st.sampled_from(["postgresql", "amqp", "amqps", "http"]),
    context=st.sampled_from(["{}", "{!r}", "(got {!r})", "cannot reach '{}' (refused)", "x {} y"]),
    suffix=st.sampled_from(["", "/x", ":5432/x?sslmode=require", "1:0,h2/x?a=b#c", "/ and @h"]),
    list_of=st.integers(1, 3),
)
def test_a_userinfo_password_is_never_shown_whatever_it_holds(
    middle: tuple[str, str], scheme: str, context: str, suffix: str, list_of: int
) -> None:
    """A password of quotes, spaces, tabs, ``@``, ``/``, ``#``, ``?``, ``:``...: in a URL,
    each node of a list, quoted or repr'd as a settings error shows it, inside a message. (Not
    masked whole: one holding an ``@`` and after it ``,b://`` or ``;b://``, a URL of its own
    after the ``@`` of one, the next node of a list.)"""
    password = _password(middle)
    assume("@" not in password.partition("://")[0] or "://" not in password)
    url = ",".join(f"{scheme}://app:{password}@h{n}{suffix}" for n in range(list_of))
    shown = masked(context.format(url))
    assert MARK not in shown, shown
    assert masked(shown) == shown


@given(
    middle=st.tuples(
        st.text(alphabet=AWKWARD.replace("&", "").replace("#", ""), max_size=8),
        st.text(alphabet=AWKWARD.replace("&", "").replace("#", ""), max_size=8),
    ),
    name=st.sampled_from(["password", "sslpassword", "Token", "X-Api-Key"]),
    context=st.sampled_from(["{}", "{!r}", "(got {!r})", "cannot reach '{}' (refused)"]),
)
def test_a_query_password_is_never_shown_whatever_it_holds(
    middle: tuple[str, str], name: str, context: str
) -> None:
    """Up to the next ``&``: a query value holds no ``&`` nor ``#`` (the parsers end it there),
    anything else."""
    url = f"postgresql://app@db/x?connect_timeout=5&{name}={_password(middle)}&sslmode=require"
    shown = masked(context.format(url))
    assert MARK not in shown, shown
    assert masked(shown) == shown


@given(middle=st.tuples(_PART, _PART))
def test_a_keyword_password_is_never_shown_whatever_it_holds(middle: tuple[str, str]) -> None:
    """libpq's keyword/value form quotes a value with ``'`` and escapes ``'`` and ``\\``."""
    password = _password(middle)
    quoted = "'" + password.replace("\\", "\\\\").replace("'", "\\'") + "'"
    for text in (f"host=db password={quoted} dbname=x", f"host=db PASSWORD = {quoted}"):
        assert MARK not in masked(text), masked(text)


# -- linear in the text -----------------------------------------------------------------------

MEGABYTE = 1 << 20


@pytest.mark.parametrize(
    "unit",
    [
        "postgresql://a:",  # a URL start that may be inside the password before it
        " postgresql://a:",  # one URL a word, none with its ``@``
        "a:",
        "@",
        ":@ ",
        "a=",
        "password=",
        "password='\\",
        "?&=",
        "x://",
        "amqp://u:p@h/?password=&",
        "a\n://x:@",
    ],
)
def test_masking_a_megabyte_built_against_it_ends(unit: str) -> None:
    """Every step is linear: a megabyte of what would make a backtracking pattern or a search
    from every URL to the end of the text quadratic returns (the suite's timeout is the
    bound)."""
    text = unit * (MEGABYTE // len(unit))
    shown = masked(text)
    assert len(shown) <= 3 * len(text)  # an empty password, ``:@``, is shown ``:***@``
