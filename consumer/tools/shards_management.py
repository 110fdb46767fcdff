"""What AMQP cannot say of a shard, from the broker's management API: its leader node and its
unacked messages (``shards status --management URL``).

One ``GET /api/queues/<vhost>/<queue>`` a shard, with the credentials of the management URL if
it has some, else those of ``RABBITMQ_URL``'s first node (and its vhost). The management API's
figures are its statistics, refreshed every ``collect_statistics_interval`` (5 s by default):
``shards status`` takes the ready and consumer counts from its own passive declares and only
the leader and the unacked count from here. Nothing here prints a password: a failure names the
URL's host and port only.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from bulk_recorder.exceptions import BulkRecorderError

TIMEOUT_S = 10.0


class ManagementUnreadable(BulkRecorderError):
    """The management API could not be read (exit 1): the message names its host, never a
    password."""


@dataclass(frozen=True, slots=True)
class LeaderAndUnacked:
    leader: str
    unacked: int


@dataclass(frozen=True, slots=True)
class Management:
    """The management API at ``base`` (no userinfo), with its credentials and the vhost."""

    base: str
    user: str
    password: str
    vhost: str

    @classmethod
    def of(cls, management_url: str, amqp_url: str) -> Management:
        """Credentials from ``management_url``'s userinfo, else from the AMQP URL's; the vhost
        from the AMQP URL's path (``/`` when it has none)."""
        api, amqp = urlsplit(management_url), urlsplit(amqp_url.split(",")[0].strip())
        if api.scheme not in ("http", "https") or not api.hostname:
            raise ManagementUnreadable(
                "--management must be an http:// or https:// URL of the management API "
                "(e.g. http://rabbitmq:15672)"
            )
        netloc = api.netloc.rpartition("@")[2]
        base = urlunsplit((api.scheme, netloc, api.path.rstrip("/"), "", ""))
        source = api if api.username is not None else amqp
        vhost = unquote(amqp.path[1:]) if amqp.path not in ("", "/") else "/"
        return cls(
            base,
            unquote(source.username or "guest"),
            unquote(source.password or "guest"),
            vhost,
        )

    def queue(self, name: str) -> LeaderAndUnacked | None:
        """The queue's leader node and unacked messages; None if it does not exist."""
        url = f"{self.base}/api/queues/{quote(self.vhost, safe='')}/{quote(name, safe='')}"
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                data = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise ManagementUnreadable(
                f"{self._where()} answered {exc.code} {exc.reason}"
            ) from None
        except (OSError, ValueError) as exc:
            raise ManagementUnreadable(f"{self._where()} could not be read ({exc})") from None
        leader = data.get("leader") or data.get("node") or "?"
        return LeaderAndUnacked(str(leader), int(data.get("messages_unacknowledged") or 0))

    def _where(self) -> str:
        parts = urlsplit(self.base)
        return f"the management API at {parts.hostname}:{parts.port or 80}"
