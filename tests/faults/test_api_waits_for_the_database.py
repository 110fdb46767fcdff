"""The API is a long-running command: started while PostgreSQL is away, it waits for it.

Like the recorder and the relay, it keeps trying (its log names the host) and answers meanwhile:
`/healthz` 200, `/readyz` 503, and every `/v1` call 503 with `Retry-After`, never a crash. It
used to die at start-up with a traceback (exit 3), so an API started before its database, as a
container platform may do, was gone for good.
"""

from __future__ import annotations

import contextlib
import json

import httpx
import pytest

from consumer.tools.generator import Generator
from tests.conftest import free_port, wait_for
from tests.faults.conftest import API, via_proxy
from tests.faults.proxy import TcpProxy

pytestmark = [pytest.mark.postgres]


async def test_an_api_started_while_the_database_is_away_waits_for_it(
    make_settings, recorders, database_url: str, pg_proxy: TcpProxy
) -> None:
    pg_proxy.cut()
    settings = make_settings(database_url=via_proxy(database_url, pg_proxy), api_auth="off")
    port = free_port()
    api = await recorders.start(settings, args=API, name="api", env={"API_PORT": str(port)})
    base = f"http://127.0.0.1:{port}"
    body = json.dumps(Generator.create(seed=3141).transaction())
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:

        async def answers() -> bool:
            assert api.running, f"the API exited: {api.log_text()[-2000:]}"
            with contextlib.suppress(httpx.TransportError):
                return (await http.get("/healthz")).status_code == 200
            return False

        await wait_for(answers, timeout=60)
        refused = pg_proxy.connections_total

        async def tried_twice() -> bool:  # it keeps trying: not one attempt and a give-up
            return pg_proxy.connections_total >= refused + 2

        await wait_for(tried_twice, timeout=60)
        assert api.running
        ready = await http.get("/readyz")
        assert ready.status_code == 503, ready.text
        posted = await http.post("/v1/transactions", content=body, headers=headers)
        assert posted.status_code == 503, posted.text
        assert "retry-after" in posted.headers
        assert "127.0.0.1" in api.log_text()  # the retry line names the host it tries

        pg_proxy.restore()

        async def ready_now() -> bool:
            return (await http.get("/readyz")).status_code == 200

        await wait_for(ready_now, timeout=60)
        posted = await http.post("/v1/transactions", content=body, headers=headers)
        assert posted.status_code == 202, posted.text
    assert await api.terminate() == 0
