"""A broker outage is one log line per change of state, at the service's level.

aiormq logs ``ERROR aiormq.connection: error when creating transport`` for every refused
connect; beside the service's own WARNING on each retry, an outage the service rides out
tripped every ERROR-level log alert. A recorder pointed at a closed port retries for real here.
"""

from __future__ import annotations

import re

import pytest

from bulk_recorder.infra.migrate import migrate
from tests.conftest import free_port, wait_for
from tests.faults.conftest import RecorderPool

pytestmark = [pytest.mark.postgres]

RETRIES = 3


async def test_a_refused_broker_is_one_warning_per_connection_and_no_error(
    make_settings, recorders: RecorderPool, database_url
) -> None:
    closed = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    settings = make_settings(rabbitmq_url=closed, log_level="DEBUG")
    await migrate(database_url)
    proc = await recorders.start(settings)

    def attempts(what: str) -> int:
        """Failed connects (the first is a warning, the retries debug lines)."""
        return len(re.findall(rf"{what}: broker at \S+ (failed|still down)", proc.log_text()))

    # every connection has failed, then been retried a few times: the state did not change
    await wait_for(
        lambda: min(attempts("consumer connection"), attempts("publishing connection")) > RETRIES,
        timeout=60,
    )
    assert await proc.terminate() == 0
    log = proc.log_text()
    for what in ("consumer connection", "publishing connection"):
        warnings = re.findall(rf"WARNING +\S+: {what}: broker at \S+ failed", log)
        assert len(warnings) == 1, (what, warnings)
    errors = [line for line in log.splitlines() if re.search(r"\bERROR\b", line)]
    assert errors == [], errors
