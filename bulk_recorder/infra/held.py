"""The deliveries a recorder holds now, oldest first: how long the oldest has been held.

The hold histogram is observed when a delivery is settled, too late to warn that one is about
to outlive the broker's consumer timeout. :class:`Held` keeps every delivery from its receipt to
its settle in a dict, which remembers insertion order, so the oldest is the first one whose
channel is still open: ``bulk_recorder_oldest_held_seconds`` reads its age at each scrape. An
add or a settle is one dict operation; a delivery of a closed channel (never settled by us: the
broker redelivers it) is forgotten when the channel is dropped, or when a scrape meets it first.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Protocol


class HeldDelivery(Protocol):
    @property
    def received(self) -> float: ...

    def alive(self) -> bool: ...


class Held:
    def __init__(self) -> None:
        self._held: dict[int, HeldDelivery] = {}

    def __len__(self) -> int:
        return len(self._held)

    def add(self, delivery: HeldDelivery) -> None:
        self._held[id(delivery)] = delivery

    def settled(self, deliveries: Iterable[HeldDelivery]) -> None:
        held = self._held
        for delivery in deliveries:
            held.pop(id(delivery), None)

    def forget_dead(self) -> int:
        """Forget the deliveries whose channel closed; returns how many."""
        dead = [key for key, delivery in self._held.items() if not delivery.alive()]
        for key in dead:
            del self._held[key]
        return len(dead)

    def oldest_age(self) -> float:
        """Seconds since the oldest delivery still held (on an open channel) arrived; 0 if none."""
        gone: list[int] = []
        age = 0.0
        for key, delivery in self._held.items():
            if delivery.alive():
                age = time.monotonic() - delivery.received
                break
            gone.append(key)
        for key in gone:
            del self._held[key]
        return age
