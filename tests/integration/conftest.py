"""Fixtures shared by the integration tests of more than one module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.otlp_receiver import OtlpReceiver


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    """A real OTLP/HTTP traces receiver on a free loopback port, for the services to export to."""
    r = OtlpReceiver()
    r.start()
    yield r
    r.stop()
