"""The ingest API (FastAPI): ``create_app`` builds it; see :mod:`.app` for the routes it serves.

FastAPI is loaded by what uses the app, not by the package: a command that needs only a
submodule (the retention command's job statements, :mod:`.job_status`) does not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bulk_recorder.producer.api.app import ApiError, create_app

__all__ = ["ApiError", "create_app"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from bulk_recorder.producer.api import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
