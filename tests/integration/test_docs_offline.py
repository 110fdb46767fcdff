"""``/docs`` renders offline (issue 12 item 7), checked in headless Chromium.

FastAPI's default Swagger UI loads its scripts from a CDN, so on an air-gapped host the page is
blank. The API now serves the assets itself. Debian's ``chromium`` loads ``/docs`` of a real
``bulk-recorder api`` process with every name but loopback unresolvable and every request that
is not to loopback sent to a dead proxy: the rendered page must list both POST endpoints. The
same browser on FastAPI's default page shows no endpoint at all, which proves the browser really
is cut off from the network (and that this check can fail).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from tests.conftest import SettingsFactory, free_port, settings_env, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

CLI = str(Path(sys.executable).with_name("bulk-recorder"))
INSTALL_HINT = "apt-get install -y chromium (Debian's package; .ci/run does it when missing)"
# data-path of each operation's summary, with its method, as Swagger UI renders them.
OPERATION = re.compile(
    r'opblock-summary-method">(?P<method>[A-Z]+)</span>.*?data-path="(?P<path>[^"]+)"', re.S
)


def _chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail(f"chromium is not installed: {INSTALL_HINT}")
    return path


async def rendered(url: str, profile: Path) -> str:
    """The DOM of ``url`` after its scripts ran, with no network beyond loopback."""
    proc = await asyncio.create_subprocess_exec(
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        # Every host name but loopback fails to resolve, and whatever is not for loopback goes
        # to a proxy on a port nothing listens on (loopback itself is never proxied).
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        f"--proxy-server=http://127.0.0.1:{free_port()}",
        "--virtual-time-budget=20000",
        "--dump-dom",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 90)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out.decode(errors="replace")


def operations(dom: str) -> set[tuple[str, str]]:
    return {(m["method"], m["path"]) for m in OPERATION.finditer(dom)}


@contextlib.asynccontextmanager
async def api_process(env: dict[str, str], log: Path) -> AsyncIterator[str]:
    port = free_port()
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            CLI, "api", env={**env, "API_PORT": str(port)}, stdout=out, stderr=out
        )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=10) as http:

            async def ready() -> bool:
                with contextlib.suppress(httpx.TransportError):
                    return (await http.get(f"{base}/readyz")).status_code == 200
                return False

            await wait_for(ready, timeout=60)
        yield base
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)


@contextlib.asynccontextmanager
async def default_docs_app() -> AsyncIterator[str]:
    """FastAPI's default /docs (Swagger UI from a CDN) for two POST routes, on loopback."""
    app = FastAPI()

    @app.post("/v1/transactions")
    async def transactions() -> None:
        return None

    @app.post("/v1/credit-annotation-jobs")
    async def jobs() -> None:
        return None

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    try:
        await wait_for(lambda: server.started, timeout=20)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)


async def test_docs_render_both_post_endpoints_with_no_network_beyond_loopback(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    env = settings_env(make_settings(), API_HOST="127.0.0.1", METRICS_PORT="0")
    async with api_process(env, tmp_path / "api.log") as api:
        async with httpx.AsyncClient(timeout=10) as http:
            page = (await http.get(f"{api}/docs")).text
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), page
        dom = await rendered(f"{api}/docs", tmp_path / "profile-docs")
        redoc = await rendered(f"{api}/redoc", tmp_path / "profile-redoc")
    found = operations(dom)
    assert {("POST", "/v1/transactions"), ("POST", "/v1/credit-annotation-jobs")} <= found, (
        f"operations rendered: {sorted(found)}\n{dom[-3000:]}"
    )
    assert ("GET", "/v1/credit-annotation-jobs/{job_id}") in found
    # each operation under its own title, not FastAPI's default from the handler's name
    titles = set(re.findall(r'opblock-summary-description">([^<]+)<', dom))
    assert titles >= {"Record a transaction", "Submit a credit-annotation job"}, titles
    assert not titles & {"Post Transaction", "Post Job", "Healthz", "Metrics Endpoint"}, titles
    # ReDoc renders the same document from the same host.
    for path in ("/v1/transactions", "/v1/credit-annotation-jobs"):
        assert path in redoc, f"ReDoc does not show {path}: {redoc[-3000:]}"


async def test_the_same_browser_shows_nothing_of_fastapis_default_cdn_page(tmp_path: Path) -> None:
    async with default_docs_app() as base:
        dom = await rendered(f"{base}/docs", tmp_path / "profile")
    assert "cdn.jsdelivr.net" in dom, dom[-2000:]  # the page asks for the CDN ...
    assert operations(dom) == set(), dom[-3000:]  # ... and renders nothing without it


@contextlib.asynccontextmanager
async def prefix_stripping_proxy(upstream: str, prefix: str) -> AsyncIterator[str]:
    """A reverse proxy serving ``upstream`` under ``prefix`` and stripping it, on loopback;
    anything outside the prefix is 404, as such a proxy routes it elsewhere."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if not path.startswith(prefix + "/"):
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b"not under the prefix"})
            return
        async with httpx.AsyncClient() as http:
            answer = await http.get(upstream + path[len(prefix) :])
        headers = [(b"content-type", answer.headers.get("content-type", "").encode())]
        await send(
            {"type": "http.response.start", "status": answer.status_code, "headers": headers}
        )
        await send({"type": "http.response.body", "body": answer.content})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    try:
        await wait_for(lambda: server.started, timeout=20)
        yield f"http://127.0.0.1:{port}{prefix}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)


@pytest.mark.parametrize("root_path", ["/bulk", ""])
async def test_docs_render_behind_a_proxy_that_strips_a_path_prefix_only_with_api_root_path(
    make_settings: SettingsFactory, tmp_path: Path, root_path: str
) -> None:
    env = settings_env(
        make_settings(), API_HOST="127.0.0.1", METRICS_PORT="0", API_ROOT_PATH=root_path
    )
    async with (
        api_process(env, tmp_path / "api.log") as api,
        prefix_stripping_proxy(api, "/bulk") as proxied,
    ):
        dom = await rendered(f"{proxied}/docs", tmp_path / "profile")
        async with httpx.AsyncClient(timeout=10) as http:
            document = (await http.get(f"{proxied}/openapi.json")).json()
    found = operations(dom)
    if root_path:
        assert ("POST", "/v1/transactions") in found, dom[-3000:]
        assert document["servers"] == [{"url": "/bulk"}]
    else:  # the page asks for /openapi.json at the root, which the proxy does not serve
        assert found == set(), sorted(found)
        assert "servers" not in document
