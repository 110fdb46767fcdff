"""Answers other than success: :class:`ApiError`, and the JSON and header conventions all
routes share.
"""

from __future__ import annotations

from typing import Any, Final

from fastapi.responses import JSONResponse
from pydantic import BaseModel

REPLAYED_HEADER: Final = "Idempotent-Replayed"
# An answer given before the whole body was read: the server closes the connection rather than
# read (and drop) the rest of it.
CLOSE_CONNECTION: Final = {"Connection": "close"}


class ApiError(Exception):
    """An answer other than success: status code, detail, optional extra body and headers."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.extra = extra or {}
        self.headers = headers


def json_response(status: int, body: BaseModel | dict[str, Any], **headers: str) -> JSONResponse:
    content = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
    return JSONResponse(content, status_code=status, headers=headers or None)
