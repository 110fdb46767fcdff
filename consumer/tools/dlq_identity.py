"""Which dead letters a ``dlq discard`` or ``dlq replay --reason`` showed: identified, not counted.

The DLQ is not ours alone: a running recorder dead-letters while a command runs, and a quorum
queue puts every message a pass gives back behind the messages ready at that moment. "The
first N of the group" after the survey is therefore not the N it showed. So the survey takes a
fingerprint of each message it shows, and the pass that acts takes a message only if its
fingerprint is in that plan (each use spends one): the plan is a multiset, so two identical
copies shown (a dead letter published twice by a crash between its confirm and its ack) are
two entries, and a third copy arriving meanwhile is not taken.

A fingerprint is a SHA-256 digest of the body, every message property, and every header but
``x-delivery-count`` (the one value the broker changes each time the message is read). Header
tables are taken with their keys sorted, so the digest does not depend on the order a client
wrote them. Nothing is stamped on the message: the DLQ is read, never rewritten, and a message
dead-lettered by the broker itself carries no id of ours. Two messages with the same digest are
the same bytes, properties and headers: taking either is the same act, and the multiset keeps
the count.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from datetime import datetime
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

# The broker raises it on every read (basic.get, then nack): not part of a message's identity.
READ_COUNT_HEADER = "x-delivery-count"


def _canonical(value: Any) -> str:
    if isinstance(value, dict):
        items = sorted((str(k), _canonical(v)) for k, v in value.items())
        return "{" + ",".join(f"{k!r}:{v}" for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_canonical(v) for v in value) + "]"
    if isinstance(value, datetime):
        return f"datetime({value.isoformat()})"
    return f"{type(value).__name__}({value!r})"


def fingerprint(message: AbstractIncomingMessage) -> bytes:
    """The digest of the body, the properties and the headers (but the read count)."""
    headers = {k: v for k, v in (message.headers or {}).items() if k != READ_COUNT_HEADER}
    properties = (
        message.content_type,
        message.content_encoding,
        message.delivery_mode,
        message.priority,
        message.correlation_id,
        message.reply_to,
        message.expiration,
        message.message_id,
        message.timestamp,
        message.type,
        message.user_id,
        message.app_id,
    )
    digest = hashlib.sha256(message.body)
    digest.update(_canonical([properties, headers]).encode())
    return digest.digest()


class Plan:
    """The messages a command showed: a multiset of fingerprints, spent as they are taken."""

    def __init__(self) -> None:
        self._left: Counter[bytes] = Counter()

    def add(self, message: AbstractIncomingMessage) -> None:
        self._left[fingerprint(message)] += 1

    def __len__(self) -> int:
        return self._left.total()

    def spend(self, message: AbstractIncomingMessage) -> bool:
        """True (and one fewer left) if ``message`` is one of those shown and not yet taken."""
        key = fingerprint(message)
        if self._left[key] <= 0:
            return False
        self._left[key] -= 1
        return True
