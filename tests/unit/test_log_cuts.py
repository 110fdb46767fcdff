"""The log formatter masks first, then cuts: a cut never keeps the start of a password. Each
string argument is cut at 512 characters and the message at 4,096; masking reads a bounded part
of what it is given (``MASK_READS`` times the cut), and a URL, a ``user:pass@`` or a
``password=`` that this bound falls in is dropped, never shown in part."""

from __future__ import annotations

import json
import logging

import pytest

from bulk_recorder.infra.logs import (
    MASK_READS,
    MAX_ARG_CHARS,
    MAX_MESSAGE_CHARS,
    TEXT_FORMAT,
    JsonFormatter,
    SafeFormatter,
)

PASSWORD = "Z" * 16  # no log line holds a Z otherwise: a Z shown is a piece of the password
URL = f"amqp://app:{PASSWORD}@rabbit.example:5672/vx"
MASKED_URL = "amqp://app:***@rabbit.example:5672/vx"
FORMATS = ["text", "json"]


class _Text:
    """A non-string argument: rendered whole into the message, cut only with it."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


def _formatted(fmt: str, msg: str, *args: object) -> tuple[str, str]:
    """(the whole line, its message) as ``fmt`` writes them."""
    record = logging.LogRecord("consumer.app", logging.INFO, __file__, 1, msg, args, None)
    if fmt == "json":
        line = JsonFormatter().format(record)
        return line, json.loads(line)["message"]
    line = SafeFormatter(TEXT_FORMAT).format(record)
    return line, line.partition("consumer.app: ")[2]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_node_list_whose_password_straddles_the_cut_shows_none_of_it(fmt: str) -> None:
    """The reported line: 11 URLs as one argument (566 characters), which was cut inside the
    tenth's password."""
    nodes = ",".join(
        f"amqp://app:Secret{i:03d}Password@rabbit-{i}.example:5672/vx" for i in range(11)
    )
    line, message = _formatted(fmt, "connecting to %s", nodes)
    assert "Secret" not in line, line
    assert message.endswith(",amqp://app:***@rabbit-10.example:5672/vx")  # now whole


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_argument_is_masked_before_it_is_cut_wherever_the_cut_falls(fmt: str) -> None:
    """The cut (512) slides over the whole URL, its password included, and past it."""
    for before in range(MAX_ARG_CHARS - len(URL) - 2, MAX_ARG_CHARS + 2):
        value = "n" * before + "," + URL
        line, message = _formatted(fmt, "nodes %s from %s", value, "10.0.0.1")
        assert "Z" not in line, (before, line)
        assert message.endswith(" from 10.0.0.1"), (before, message)  # the rest is kept


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_an_argument_is_cut_past_512_masked_characters(fmt: str, extra: int) -> None:
    """512 characters once masked (the argument itself is longer): whole; 513: cut."""
    masked_value = "n" * (MAX_ARG_CHARS + extra - 1 - len(MASKED_URL)) + "," + MASKED_URL
    value = masked_value.replace(MASKED_URL, URL)
    assert len(value) > MAX_ARG_CHARS
    assert len(masked_value) == MAX_ARG_CHARS + extra
    line, message = _formatted(fmt, "nodes %s from %s", value, "10.0.0.1")
    assert "Z" not in line
    if extra <= 0:
        assert message == f"nodes {masked_value} from 10.0.0.1"
    else:
        shown = masked_value[:MAX_ARG_CHARS]
        assert message == f"nodes {shown}... (1 more characters) from 10.0.0.1"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_an_argument_of_512_characters_is_whole_and_of_513_cut(fmt: str, extra: int) -> None:
    value = "n" * (MAX_ARG_CHARS + extra)
    _, message = _formatted(fmt, "path %s from %s", value, "10.0.0.1")
    if extra <= 0:
        assert message == f"path {value} from 10.0.0.1"
    else:
        assert message == f"path {value[:-1]}... (1 more characters) from 10.0.0.1"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("how", ["template", "object"])
def test_a_message_is_masked_before_it_is_cut_wherever_the_cut_falls(fmt: str, how: str) -> None:
    """The message's cut (4,096) slides over the URL: the message as written, or a non-string
    argument (not cut on its own) rendered into it."""
    for before in range(MAX_MESSAGE_CHARS - len(URL) - 2, MAX_MESSAGE_CHARS + 2):
        text = "n" * before + "," + URL
        line, message = (
            _formatted(fmt, text) if how == "template" else _formatted(fmt, "%s", _Text(text))
        )
        assert "Z" not in line, (before, line)
        masked_text = text.replace(URL, MASKED_URL)
        if len(masked_text) <= MAX_MESSAGE_CHARS:
            assert message == masked_text
        else:
            assert message.startswith(masked_text[:MAX_MESSAGE_CHARS] + "... (")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_a_message_of_4096_masked_characters_is_whole_and_of_4097_cut(fmt: str, extra: int) -> None:
    masked_text = "n" * (MAX_MESSAGE_CHARS + extra - 1 - len(MASKED_URL)) + "," + MASKED_URL
    line, message = _formatted(fmt, masked_text.replace(MASKED_URL, URL))
    assert "Z" not in line
    if extra <= 0:
        assert message == masked_text
    else:
        assert message == masked_text[:MAX_MESSAGE_CHARS] + "... (1 more characters)"


# -- the bound on what masking reads ----------------------------------------------------------

LONG_PASSWORD = "Z" * 600  # masked to 3 characters: what lies at the bound comes into view
HALF = "Z" * 300
SECRETS = {
    "url list": f"amqp://app:{LONG_PASSWORD}@h.example:5672/vx,",  # one line: dropped whole
    "url lines": f"amqp://app:{LONG_PASSWORD}@h.example:5672/vx\n",
    "url with a space": f"amqp://app:{HALF} {HALF}@h.example:5672/vx\n",
    "bare": f"app:{LONG_PASSWORD}@h.example ",
    "keyword": f"password={LONG_PASSWORD} ",
    "quoted keyword": f"password='{HALF} {HALF}' ",
}


def _across(bound: int, offset: int, form: str) -> str:
    """Secrets of ``form`` one after the other, the bound falling ``offset`` characters into
    one of them, not the first."""
    one = SECRETS[form]
    before, pad = divmod(bound - offset - len(one), len(one))
    return one.replace("Z", "Z" * (pad + 1), 1) + one * (before + 3)


def _offsets(form: str) -> list[int]:
    """Every place in the scheme, the user and around both ends of the password, and a few in
    the host."""
    one = SECRETS[form]
    start, end = one.index("Z"), one.rindex("Z") + 1
    return sorted({*range(start + 3), start + 300, *range(end - 2, min(end + 8, len(one)))})


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("form", sorted(SECRETS))
@pytest.mark.parametrize("path", ["argument", "message"])
def test_a_password_across_the_masking_bound_is_never_shown(fmt: str, form: str, path: str) -> None:
    """What masking reads is bounded (``MASK_READS`` times the cut); long passwords mask to
    ``***``, so what lies at that bound is within the cut: a secret the bound falls in, which
    masking cannot see the end of, is dropped, and a URL's password may run to the end of its
    line (the list, on one line, is dropped whole)."""
    limit = MAX_ARG_CHARS if path == "argument" else MAX_MESSAGE_CHARS
    for offset in _offsets(form):
        text = _across(MASK_READS * limit, offset, form)
        line, message = (
            _formatted(fmt, "nodes %s from %s", text, "10.0.0.1")
            if path == "argument"
            else _formatted(fmt, "%s", _Text(text))
        )
        assert "Z" not in line, (offset, line[-300:])
        assert "***" in message or form == "url list"  # the secrets before it: shown, masked
        end = "more characters)" + (" from 10.0.0.1" if path == "argument" else "")
        assert message.endswith(end), (offset, message[-300:])
