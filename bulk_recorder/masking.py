"""Secrets out of every URL or DSN the service prints or logs: one function, :func:`masked`.

It is applied to a settings error's value, to each ``endpoint()`` and, by the log formatter
(:mod:`bulk_recorder.infra.logs`), to every rendered log line, so that a call site cannot forget
it. What is masked, each replaced by ``***``:

- the password of a URL's userinfo, which ends at the LAST ``@`` before the host (a password
  may hold ``@``, ``/``, ``?`` or ``#``: asyncpg and yarl would misread some, and the value is
  then printed by the error that says so);
- the value of a secret query parameter (``password``, ``sslpassword``: asyncpg and libpq take
  them there; a few token names for other URLs), its name compared percent-decoded;
- each URL of a comma-separated list (``RABBITMQ_URL``'s nodes);
- ``password=...`` in libpq's keyword/value form (``host=db password=...``), and ``user:pass@``
  written without a scheme.

Over-masking is the safe side: when it cannot tell, the host goes too.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus, urlsplit

MASK = "***"
SECRET_PARAMETERS = frozenset(
    {"password", "passwd", "sslpassword", "token", "access_token", "api_key", "apikey", "secret"}
)
# Every pattern here is linear in the text: a log line may quote 60 KB from outside.
_NAMES = "|".join(sorted(SECRET_PARAMETERS))
_KEYWORD = re.compile(r"(?i)(?<![\w.%-])(" + _NAMES + r")(\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)")
_WORD_END = re.compile(r"[\s'\"]")  # a URL or a bare ``user:pass@host`` ends there
_WORD = re.compile(r"[^\s'\"]+")
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_MAX_SCHEME = 32


def masked(text: str) -> str:
    """``text`` with every password in it replaced by ``***`` (see the module's docstring)."""
    out: list[str] = []
    last = 0
    starts = _url_starts(text)
    for number, (_, rest) in enumerate(starts):
        # a URL ends at white space, a quote or the next URL's scheme (``?next=https://...``)
        following = starts[number + 1][0] if number + 1 < len(starts) else len(text)
        end = _WORD_END.search(text, rest, following)
        stop = end.start() if end else following
        out.append(_masked_words(text[last:rest]))
        out.append(_masked_rest(text[rest:stop]))
        last = stop
    out.append(_masked_words(text[last:]))
    return "".join(out)


def _url_starts(text: str) -> list[tuple[int, int]]:
    """(where its scheme starts, where what follows ``://`` starts) of each URL in ``text``."""
    found: list[tuple[int, int]] = []
    at = text.find("://")
    while at >= 0:
        start = at
        while start > max(0, at - _MAX_SCHEME) and text[start - 1] in _SCHEME_CHARS:
            start -= 1
        while start < at and not text[start].isalpha():  # a scheme begins with a letter
            start += 1
        if start < at:
            found.append((start, at + 3))
        at = text.find("://", at + 3)
    return found


def endpoint(url: str) -> str:
    """``host:port[,host:port...]/path`` of a URL: no user, no password, no query (for logs)."""
    parts = urlsplit(masked(url))
    return f"{parts.netloc.rpartition('@')[2]}{parts.path or '/'}"


def _masked_words(text: str) -> str:
    """``password=...`` (keyword/value) and a bare ``user:pass@host`` word masked."""
    text = _KEYWORD.sub(lambda m: m[1] + m[2] + MASK, text)
    return _WORD.sub(_bare_userinfo, text) if "@" in text else text


def _bare_userinfo(match: re.Match[str]) -> str:
    word = match[0]
    at = word.rfind("@")
    colon = word.find(":", 0, at) if at > 0 else -1
    if colon < 0 or "/" in word[:colon]:
        return word
    return word[:colon] + ":" + MASK + word[at:]


def _masked_rest(rest: str) -> str:
    """What follows ``scheme://``: userinfo, host, path, query, fragment."""
    query_at = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, query_at)
    if at < 0:  # no userinfo before the query; an @ after it may still end a password
        at = rest.rfind("@")
        if at >= 0 and ":" not in rest[:at]:
            at = -1  # ``db/x?user=a@b``: an @ in the query, no password
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        rest = (user + ":" + MASK if colon else rest[:at]) + rest[at:]
    head, mark, query = rest.partition("?")
    if not mark:
        return rest
    query, hash_, fragment = query.partition("#")
    pairs = []
    for pair in query.split("&"):
        name, equals, _ = pair.partition("=")
        secret = equals and unquote_plus(name).strip().lower() in SECRET_PARAMETERS
        pairs.append(name + "=" + MASK if secret else pair)
    return head + "?" + "&".join(pairs) + hash_ + fragment
