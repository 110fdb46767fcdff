"""The OpenAPI document names its operations and speaks to the API's users.

Generated clients name their methods by ``operationId``: FastAPI's own
(``post_transaction_v1_transactions_post``) changes with a handler's name or path. The
``info.description`` is what /docs shows first: Markdown for users, not a docstring.
"""

from __future__ import annotations

import re
from typing import Any

from bulk_recorder.producer.api import create_app
from settings import Settings

EXPECTED = {
    ("get", "/healthz"): "getLiveness",
    ("get", "/readyz"): "getReadiness",
    ("get", "/metrics"): "getMetrics",
    ("post", "/v1/transactions"): "createTransaction",
    ("post", "/v1/credit-annotation-jobs"): "createCreditAnnotationJob",
    ("get", "/v1/credit-annotation-jobs/{job_id}"): "getCreditAnnotationJob",
}


def _document() -> dict[str, Any]:
    return create_app(Settings()).openapi()


def test_every_operation_has_its_explicit_operation_id() -> None:
    found = {
        (method, path): operation["operationId"]
        for path, item in _document()["paths"].items()
        for method, operation in item.items()
    }
    assert found == EXPECTED


def test_the_description_is_for_users_not_a_docstring() -> None:
    description = _document()["info"]["description"]
    assert not re.search(r":(func|mod|class|meth|data):|``", description), description
    for route in ("POST /v1/transactions", "POST /v1/credit-annotation-jobs"):
        assert route in description
    assert "Authorization: Bearer" in description
