"""``/docs`` (Swagger UI) and ``/redoc`` that work offline: their scripts come from this host.

FastAPI's default pages load Swagger UI and ReDoc from a CDN, so on an air-gapped host ``/docs``
is a blank page. Here the assets are the package data of ``fastapi-offline`` (Swagger UI 5, which
renders the OpenAPI 3.1 document FastAPI emits, and ReDoc), served by the API under
``/docs-assets``, and the pages are FastAPI's own HTML with those URLs. Build the app with
``docs_url=None, redoc_url=None`` and call :func:`serve_docs_offline` on it.
"""

from __future__ import annotations

import logging
from importlib import resources
from typing import Final

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

log = logging.getLogger(__name__)

__all__ = ["API_DESCRIPTION", "ASSETS_URL", "DOCS_URL", "REDOC_URL", "serve_docs_offline"]

DOCS_URL: Final = "/docs"
REDOC_URL: Final = "/redoc"
ASSETS_URL: Final = "/docs-assets"
OAUTH2_REDIRECT_URL: Final = "/docs/oauth2-redirect"

# The document's info.description: for the API's users, in Markdown (what /docs renders).
API_DESCRIPTION: Final = """\
Send ledger records to bulk-recorder over HTTP: transactions one at a time, credit annotations
in jobs of many lines. Every accepted record is recorded exactly once, however often it is sent.

**Authentication.** Every `/v1` call needs an API key in `Authorization: Bearer <key>`, with
the scope of the route (`transactions:write`, `jobs:write`, `jobs:read`). A missing or unknown
key is 401, a key without the scope 403. A client sees only its own jobs.

**Sending a transaction.** `POST /v1/transactions` with one transaction as JSON. The answer is
202 (accepted: it is stored and will be recorded) or, on a deployment that records at once,
201 (recorded). Sending the same `id`, or the same `Idempotency-Key`, again is answered with
the first outcome, never a second record: retry freely after a timeout or a 503.

**Sending a job.** `POST /v1/credit-annotation-jobs` with a JSON array, NDJSON or CSV body
(by `Content-Type`). Valid lines are accepted together; invalid ones are listed in the answer
with their line numbers and reasons. Follow the job with
`GET /v1/credit-annotation-jobs/{job_id}` until every line is recorded.

**Errors.** Every error is `application/problem+json` with a precise `detail`. 4xx: fix the
request before sending it again. 503 (the database is unreachable) comes with `Retry-After`:
send the same request again after it. The request and answer schemas below state every rule
the API checks.
"""


def _assets_dir() -> str:
    return str(resources.files("fastapi_offline").joinpath("static"))


def serve_docs_offline(app: FastAPI) -> None:
    """Add ``/docs``, its OAuth2 redirect, ``/redoc`` and their assets to ``app``."""
    if app.docs_url is not None or app.redoc_url is not None:
        raise ValueError("build the app with docs_url=None and redoc_url=None")
    openapi_url = app.openapi_url or "/openapi.json"
    app.mount(ASSETS_URL, StaticFiles(directory=_assets_dir()), name="docs-assets")

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT_URL}",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )

    log.debug("API docs at %s and %s, assets from %s", DOCS_URL, REDOC_URL, _assets_dir())
