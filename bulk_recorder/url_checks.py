"""What is wrong with a URL that cannot be read, in our words: never a parser's.

urllib, yarl, asyncpg and http.client say why they cannot read a URL by quoting the part they
could not read. A password holding ``/``, ``?`` or ``#`` (which must be percent-encoded) ends
the URL's host part early, so the part of the password before that character is quoted as a
port (``invalid literal for int() with base 10: 'S3cr'``), the part after it as a query
(``bad query field: 'et@db/x'``); with a number before it (``7319/et``) the URL is read, and the
driver connects to the host ``app`` with the rest of the password for a path. And a value with
no scheme (``app:pw@h1/``) is no URL that masking recognises. So the URL settings are checked
here, as the drivers read them, and a connect that fails to parse a URL says
:class:`UnreadableUrl`, naming the variable, instead of the parser's text.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

from bulk_recorder.exceptions import EXIT_SETTINGS, BulkRecorderError

ENCODE = "a password holding / ? or # must be percent-encoded (%2F %3F %23)"
UNREADABLE = (
    "the URL cannot be parsed (a port that is not a number, a query that is not name=value "
    f"pairs?); {ENCODE}"
)
# a scheme (RFC 3986), at most 20 characters, then ``://``
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]{0,19})://")


class UnreadableUrl(BulkRecorderError):
    """A driver could not parse a URL setting; the message names the variable, not the URL."""

    exit_code = EXIT_SETTINGS

    def __init__(self, variable: str) -> None:
        super().__init__(f"invalid settings: {variable}: {UNREADABLE}")


def scheme_of(url: str) -> str | None:
    """``url``'s scheme, or None when it does not start with ``scheme://`` (``app:pw@h1/``)."""
    found = _SCHEME.match(url)
    return found[1] if found else None


def url_problem(url: str, *, strict_query: bool) -> str:
    """Why the drivers cannot read ``url`` as it was meant ("" when they can); never quotes it,
    and holds no ``:`` or ``@`` (masking would take the text around them for a password).

    ``strict_query``: the query must be ``name=value`` pairs joined by ``&`` (asyncpg's rule);
    without it (aiormq, urllib) an ``@`` in the query counts as one after the host."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "cannot be parsed (a [ without its ] or the reverse)"
    _, at, hostspec = parts.netloc.rpartition("@")
    if not all(_is_port(_port_of(host)) for host in hostspec.split(",")):
        return f"cannot be parsed (its port is not a number from 0 to 65535); {ENCODE}"
    after = parts.path + parts.fragment + ("" if strict_query else parts.query)
    if not at and ":" in hostspec and "@" in after:
        return f"cannot be parsed (no user before its host, yet an at sign after it); {ENCODE}"
    if strict_query and parts.query:
        try:
            parse_qsl(parts.query, strict_parsing=True)
        except ValueError:
            return f"cannot be parsed (its query is not name=value pairs joined by &); {ENCODE}"
    return ""


def _port_of(host: str) -> str:
    """The port of ``host:port`` or ``[v6]:port`` as urllib and asyncpg read it ("" if none)."""
    if host.startswith("["):
        return host.partition("]")[2].partition(":")[2]
    return host.partition(":")[2]


def _is_port(text: str) -> bool:
    return not text or (text.isascii() and text.isdigit() and int(text) <= 65_535)
