"""Secrets out of every URL or DSN the service prints or logs: one function, :func:`masked`.

It is applied to a settings error's value, to each ``endpoint()`` and, by the log formatter
(:mod:`bulk_recorder.infra.logs`), to every rendered log line, so that a call site cannot forget
it. What is masked, each replaced by ``***``:

- the password of a URL's userinfo, whatever it holds: everything from ``scheme://user:`` to the
  LAST ``@`` of the URL's stretch of text. A password may hold ``@``, ``/``, ``?``, ``#``, a
  quote, a space or a tab (asyncpg and yarl accept some, misread others, and the value is then
  printed by the error that says so), so a URL does not end at white space or a quote: its
  stretch runs to the next URL that starts a word (the next node of a list, another URL of the
  message) or to the end of the line. A URL inside a password (``app:a,b://c@h``) does not cut
  it: a stretch with ``user:`` and no ``@`` runs on to the next ``@`` of its line;
- the value of a secret query parameter, to the next ``&`` (a quote, a space, a ``#`` do not
  end it): ``password``, ``sslpassword`` (asyncpg and libpq take them there), and every name
  :func:`is_secret_name` knows (``api-key``, ``Token``...), compared percent-decoded;
- each URL of a comma-separated list (``RABBITMQ_URL``'s nodes);
- ``NAME=value`` in plain text for the same names (libpq's keyword/value form
  ``host=db password=...``, a quoted value whole; ``PGPASSWORD=...``, ``x-api-key=...``), and
  ``user:pass@`` written without a scheme.

Over-masking is the safe side: when it cannot tell, the host goes too (a URL with a password or
a port followed, on its line, by another ``@`` is masked up to that ``@``). A value masked
already (``user:***@``, ``password=***``) is left as it is, so that masking twice (an argument,
then the line holding it) masks no more than once. Every step is linear in the text (no
pattern backtracks, each search covers its own stretch): a log line may quote 60 KB from
outside. Not masked whole: a password holding a line break, or an ``@`` and after it a URL
that starts a word (``x@y,b://z``: the next node of a list).
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus, urlsplit

MASK = "***"
# A name holds a secret when, lower-cased and without white space, ``-``, ``_`` and ``.``, it
# ends with one of these: password, PGPASSWORD, sslpassword, api-key, x-api-key, access_token...
SECRET_NAME_ENDINGS = (
    "password",
    "passwd",
    "passphrase",
    "pwd",
    "secret",
    "token",
    "apikey",
    "secretkey",
    "privatekey",
    "accesskey",
    "signature",
    "credential",
    "credentials",
)
_NAME_NOISE = re.compile(r"[\s._-]+")
# ``NAME=value`` in plain text, for a name that may be secret (the look-ahead spares a call of
# is_secret_name for each ``a=``); possessive: no backtracking into a long word
_NAME = r"(?=[\w.-]*?(?i:pass|pwd|secret|token|key|signature|credential))([A-Za-z_][\w.-]*+)"
_KEYWORD = re.compile(r"(?<![\w.%-])" + _NAME + r"\s*+=\s*+")
# the same, but not a query string's (``?password=``, ``&token=``: a URL's, masked with it)
_TEXT_KEYWORD = re.compile(r"(?<![\w.%?&-])" + _NAME + r"\s*+=\s*+")
# a value: quoted, whole (a repr may escape its quotes with a backslash and double the one of an
# escaped quote: no quote after a backslash ends it), or up to white space
_KEYWORD_VALUE = re.compile(r"\\*+'(?:[^'\\]|\\+.)*+'?|\\*+\"(?:[^\"\\]|\\+.)*+\"?|\S*+")
# a bare ``user:pass@host`` word (no scheme; it ends at white space or a quote): the user, then
# the password to the word's last ``@``
_BARE_USERINFO = re.compile(r"(?<![^\s'\"])([^\s'\"/:]*+):[^\s'\"]*@")
_LINE_END = re.compile(r"[\r\n]")  # a URL's stretch of text ends there at the latest
_HOST_END = re.compile(r"[?#\s'\"]")  # the host and path of a URL end there
_NOT_IN_USER = re.compile(r"[/?#\[\]]")  # a ``:`` after one of these is not the userinfo's
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_MAX_SCHEME = 32
# what a URL that starts a word follows (a list's comma, white space, a quote, ``?next=``...)
_BEFORE_URL = frozenset(" \t\n\r\f\v'\"`,;=(<[{>|")
# what follows a value that was masked already (``password=***, sampler ...``)
_AFTER_MASK = frozenset(" \t\n\r\f\v'\"`,;)]}>&#")


def masked(text: str) -> str:
    """``text`` with every password in it replaced by ``***`` (see the module's docstring)."""
    if "=" in text:  # first: a value (``password='a b://c'``) may hold what looks like a URL
        text = _masked_keywords(text, _TEXT_KEYWORD)
    out: list[str] = []
    last = 0
    for rest, end in _url_stretches(text):
        out.append(_masked_words(text[last:rest]))
        out.append(_masked_url(text[rest:end]))
        last = end
    out.append(_masked_words(text[last:]))
    return "".join(out)


def is_secret_name(name: str) -> bool:
    """Whether a query parameter or a ``NAME=value`` named ``name`` holds a secret, whatever
    its case: ``password``, ``PGPASSWORD``, ``Api-Key``, ``x-api-key``, ``client_secret``..."""
    return _NAME_NOISE.sub("", name).lower().endswith(SECRET_NAME_ENDINGS)


def endpoint(url: str) -> str:
    """``host:port[,host:port...]/path`` of a URL: no user, no password, no query (for logs)."""
    parts = urlsplit(masked(url))
    return f"{parts.netloc.rpartition('@')[2]}{parts.path or '/'}"


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


def _url_stretches(text: str) -> list[tuple[int, int]]:
    """(where what follows ``scheme://`` starts, where the URL's stretch ends) of each URL that
    starts a word or a line's first. One that does not (``app:a://b@h``, ``app:x@y://z@h``) may
    be inside a password: it belongs to the stretch before it on its line."""
    chosen: list[tuple[int, int, int]] = []  # (scheme's start, rest, its line's end)
    line_end = -1
    for start, rest in _url_starts(text):
        if start < line_end and text[start - 1] not in _BEFORE_URL:
            continue
        if start >= line_end:  # a line with no URL chosen yet: one search a line
            found = _LINE_END.search(text, rest)
            line_end = found.start() if found else len(text)
        chosen.append((start, rest, line_end))
    stretches = []
    for number, (_, rest, end) in enumerate(chosen):
        following = chosen[number + 1][0] if number + 1 < len(chosen) else len(text)
        stretches.append((rest, min(end, following)))
    return _joined(text, stretches)


def _joined(text: str, stretches: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``stretches`` with each that holds ``user:`` but no ``@`` run on to the next on its line
    that holds an ``@`` (its password may hold ``;b://c``: the host is after that ``@``), and
    each that ends in a secret query value run on to the next ``&`` (``?password=a,b://c``)."""
    count = len(stretches)
    next_at: list[int] = [-1] * count  # the first stretch from this one, on its line, with an @
    for number in range(count - 1, -1, -1):
        rest, end = stretches[number]
        if text.find("@", rest, end) >= 0:
            next_at[number] = number
        elif number + 1 < count and text[end] not in "\r\n":  # the next one is on its line
            next_at[number] = next_at[number + 1]
    joined = []
    number = 0
    while number < count:
        rest, end = stretches[number]
        last = number
        if next_at[number] > number and _may_hold_a_password(text, rest, end):
            last = next_at[number]
        open_value = _ends_in_a_secret_value(text, rest, stretches[last][1])
        while open_value and last + 1 < count and text[stretches[last][1]] not in "\r\n":
            last += 1
            amp = text.rfind("&", *stretches[last])
            if amp >= 0:  # the value ends there; another may start after the last ``&``
                open_value = _secret_pair_at(text, amp + 1, stretches[last][1])
        joined.append((rest, stretches[last][1]))
        number = last + 1
    return joined


def _may_hold_a_password(text: str, rest: int, end: int) -> bool:
    """Whether the URL whose ``scheme://`` ends at ``rest`` has a ``user:`` before ``end``."""
    colon = text.find(":", rest, end)
    return colon >= 0 and not _NOT_IN_USER.search(text, rest, colon)


def _ends_in_a_secret_value(text: str, rest: int, end: int) -> bool:
    """Whether the URL from ``rest`` to ``end`` ends in the value of a secret query parameter."""
    at = _password_at(text, rest, end)[1]
    host_end = _HOST_END.search(text, at + 1 if at >= 0 else rest, end)
    if host_end is None or text[host_end.start()] != "?":
        return False
    return _secret_pair_at(text, max(host_end.start(), text.rfind("&", rest, end)) + 1, end)


def _secret_pair_at(text: str, start: int, end: int) -> bool:
    equals = text.find("=", start, end)
    return equals >= 0 and is_secret_name(unquote_plus(text[start:equals]))


def _masked_url(rest: str) -> str:
    """A URL's stretch from what follows ``scheme://``: the userinfo's password and the secret
    query values masked; the text after the URL masked as plain text."""
    head, pos = _masked_userinfo(rest)
    if pos and _secret_value_across(rest, pos - 1):
        # or that ``@`` was in a secret query value (``c:4318/x?token=a@b&y=1``): to its end
        amp = rest.find("&", pos)
        return head + MASK + ("" if amp < 0 else "&" + _masked_query(rest[amp + 1 :]))
    host_end = _HOST_END.search(rest, pos)
    if host_end is None:
        return head + rest[pos:]
    at = host_end.start()
    if rest[at] != "?":
        return head + rest[pos:at] + _masked_words(rest[at:])
    return head + rest[pos : at + 1] + _masked_query(rest[at + 1 :])


def _masked_userinfo(rest: str) -> tuple[str, int]:
    """(``user:***@`` or "", where the host starts) of a URL's stretch."""
    colon, at = _password_at(rest, 0, len(rest))
    if colon < 0:
        return "", 0
    return rest[:colon] + ":" + MASK + "@", at + 1


def _password_at(text: str, rest: int, end: int) -> tuple[int, int]:
    """(the ``:`` before the password, the ``@`` after it) of the URL from ``rest`` to ``end``,
    or (-1, -1): the password runs from the first ``:`` to the last ``@``, whatever it holds."""
    at = text.rfind("@", rest, end)
    if at < 0:
        return -1, -1
    colon = text.find(":", rest, at)
    if colon < 0 or _NOT_IN_USER.search(text, rest, colon):  # no password (``db/x?user=a@b``)
        return -1, -1
    if text.startswith(MASK + "@", colon + 1):  # masked already: the host follows
        at = colon + 1 + len(MASK)
    return colon, at


def _secret_value_across(rest: str, at: int) -> bool:
    """Whether, were there no password, the ``@`` at ``at`` would be in a secret query value."""
    host_end = _HOST_END.search(rest, 0, at)
    if host_end is None or rest[host_end.start()] != "?":
        return False
    return _secret_pair_at(rest, max(host_end.start(), rest.rfind("&", 0, at)) + 1, at)


def _masked_query(query: str) -> str:
    """A query string and what follows it: a secret parameter's value runs to the next ``&``
    (a quote, a space, ``#``: the value goes on); another ends the query at a ``#``."""
    out: list[str] = []
    pos = 0
    while True:
        amp = query.find("&", pos)
        stop = len(query) if amp < 0 else amp
        name, equals, value = query[pos:stop].partition("=")
        if equals and is_secret_name(unquote_plus(name)):
            out.append(name + "=" + MASK)
            if value.startswith(MASK) and (value == MASK or value[len(MASK)] in _AFTER_MASK):
                out.append(_masked_words(value[len(MASK) :]))  # masked already; then text
        else:
            hash_at = query.find("#", pos, stop)
            if hash_at >= 0:  # the fragment, and whatever follows the URL
                out.append(_masked_words(query[pos:hash_at]) + _masked_words(query[hash_at:]))
                return "".join(out)
            out.append(_masked_words(query[pos:stop]))
        if amp < 0:
            return "".join(out)
        out.append("&")
        pos = amp + 1


def _masked_words(text: str) -> str:
    """``NAME=value`` for a secret name, and a bare ``user:pass@host`` word, masked."""
    if "=" in text:
        text = _masked_keywords(text, _KEYWORD)
    return _BARE_USERINFO.sub(r"\1:" + MASK + "@", text) if "@" in text else text


def _masked_keywords(text: str, keyword: re.Pattern[str]) -> str:
    out: list[str] = []
    pos = 0
    for match in keyword.finditer(text):
        if match.start() < pos or not is_secret_name(match[1]):
            continue
        value = _KEYWORD_VALUE.match(text, match.end())
        out.append(text[pos : match.end()] + MASK)
        pos = value.end() if value else match.end()
    out.append(text[pos:])
    return "".join(out)
