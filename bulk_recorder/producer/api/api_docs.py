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

__all__ = ["ASSETS_URL", "DOCS_URL", "REDOC_URL", "serve_docs_offline"]

DOCS_URL: Final = "/docs"
REDOC_URL: Final = "/redoc"
ASSETS_URL: Final = "/docs-assets"
OAUTH2_REDIRECT_URL: Final = "/docs/oauth2-redirect"


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
