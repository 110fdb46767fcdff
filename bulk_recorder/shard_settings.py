"""How many quorum queues (shards) the record stream is spread over, and which a recorder takes.

They live here, at the settings' own layer, for the reason :mod:`bulk_recorder.otel_settings`
does: ``settings.py`` stays one screen of the shared settings; :class:`settings.Settings`
inherits them. The names and the topology they give are :mod:`consumer.topology`'s.
"""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

MAX_SHARDS = 64
# The most replicas RABBITMQ_QUEUE_SHARD_REPLICAS may ask of a shard (a quorum queue's group).
MAX_SHARD_REPLICAS = 7


def parse_shard_list(text: str) -> tuple[int, ...]:
    """``"1,3"``, ``"2-4"`` or a mix (``"1,3-5"``) as sorted shard numbers, each from 1 to
    :data:`MAX_SHARDS`; ``""`` (or blanks) is ``()``, meaning every shard. Raises ValueError
    saying what is wrong with which entry."""
    numbers: set[int] = set()
    entries = [entry.strip() for entry in text.split(",")] if text.strip() else []
    for entry in entries:
        low_text, dash, high_text = entry.partition("-")
        low = _shard_number(low_text, entry)
        high = _shard_number(high_text, entry) if dash else low
        if dash and low > high:
            raise ValueError(f"the range {entry!r} runs backwards (write {high}-{low})")
        numbers.update(range(low, high + 1))
    return tuple(sorted(numbers))


def _shard_number(text: str, entry: str) -> int:
    text = text.strip()
    if not text.isdigit():
        raise ValueError(
            f"{entry!r} is not a shard number or a range of them (e.g. 1,3 or 2-4)"
            if entry
            else "has an empty entry (e.g. 1,3 or 2-4)"
        )
    number = int(text)
    if not 1 <= number <= MAX_SHARDS:
        raise ValueError(f"shard {number} is out of range: shards are numbered 1 to {MAX_SHARDS}")
    return number


class ShardSettings(BaseSettings):
    """``RABBITMQ_QUEUE_SHARDS``, ``RABBITMQ_QUEUE_SHARD_REPLICAS`` and
    ``RABBITMQ_QUEUE_SHARDS_CONSUMED``."""

    rabbitmq_queue_shards: int = Field(
        1,
        ge=1,
        le=MAX_SHARDS,
        description=(
            "Quorum queues the records are spread over; 1 is the one queue RABBITMQ_QUEUE. "
            "With more, needs the rabbitmq_random_exchange plugin on every broker node."
        ),
    )
    rabbitmq_queue_shard_replicas: int = Field(
        0,
        ge=0,
        le=MAX_SHARD_REPLICAS,
        description=(
            "Replicas of each shard 2..N (x-quorum-initial-group-size); 0: one on every broker "
            "node, as RABBITMQ_QUEUE has. Below 3 a shard cannot survive the loss of a node it "
            "is on. Shard 1 (RABBITMQ_QUEUE) keeps its own arguments; with one shard, unused."
        ),
    )
    rabbitmq_queue_shards_consumed: str = Field(
        "",
        description=(
            "The shards this recorder consumes, as 1,3 or 2-4; empty: every shard that exists."
        ),
    )

    @field_validator("rabbitmq_queue_shards_consumed")
    @classmethod
    def _shard_list(cls, value: str) -> str:
        parse_shard_list(value)  # a ValueError names the entry; load_settings the variable
        return value.strip()

    @property
    def shards_consumed(self) -> tuple[int, ...]:
        """The shard numbers of RABBITMQ_QUEUE_SHARDS_CONSUMED; ``()``: every shard."""
        return parse_shard_list(self.rabbitmq_queue_shards_consumed)
