"""The ingest API (FastAPI): ``create_app`` builds it; see :mod:`.app` for the routes it serves."""

from bulk_recorder.producer.api.app import ApiError, create_app

__all__ = ["ApiError", "create_app"]
