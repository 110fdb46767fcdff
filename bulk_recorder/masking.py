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
# A URL runs from its scheme to white space, a quote, or the next URL's scheme.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://((?:(?![A-Za-z][A-Za-z0-9+.-]*://)[^\s'\"])*)")
_NAMES = "|".join(sorted(SECRET_PARAMETERS))
_KEYWORD = re.compile(r"(?i)(?<![\w.%-])(" + _NAMES + r")(\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)")
# ``user:password@host`` with no scheme, as one token
_BARE_USERINFO = re.compile(
    r"(?<![^\s'\"(,=])([^\s'\"/@:]*):[^\s'\"]*@(?=[^\s'\"@]*(?:[\s'\"]|\Z))"
)


def masked(text: str) -> str:
    """``text`` with every password in it replaced by ``***`` (see the module's docstring)."""
    out: list[str] = []
    last = 0
    for match in _URL.finditer(text):
        out.append(_masked_words(text[last : match.start(1)]))
        out.append(_masked_rest(match[1]))
        last = match.end()
    out.append(_masked_words(text[last:]))
    return "".join(out)


def endpoint(url: str) -> str:
    """``host:port[,host:port...]/path`` of a URL: no user, no password, no query (for logs)."""
    parts = urlsplit(masked(url))
    return f"{parts.netloc.rpartition('@')[2]}{parts.path or '/'}"


def _masked_words(text: str) -> str:
    text = _KEYWORD.sub(lambda m: m[1] + m[2] + MASK, text)
    return _BARE_USERINFO.sub(lambda m: m[1] + ":" + MASK + "@", text)


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
