"""Variables with a setting's prefix that no setting reads: most likely a misspelt setting.

The entrypoint (``consumer.cli``) gives its environment once the settings are built and logging
is set up; each such variable is one WARNING line naming the closest real name. Nothing here
reads the environment itself.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping

from settings import SECRET_FILE_SETTINGS, Settings

log = logging.getLogger("settings")


# The prefixes of the service's settings: a variable with one of them that no setting reads is
# most likely a misspelt setting (one line at start-up names the closest real one).
SETTING_PREFIXES = (
    "RABBITMQ_",
    "BULK_RECORDER_",
    "DATABASE_",
    "API_",
    "RELAY_",
    "METRICS_",
    "LOG_",
    "OTEL_",
)
# Variables with those prefixes that are read elsewhere, not settings: the install's (setup.py),
# the image build's, and docker compose's secrets folder.
NOT_SETTINGS = frozenset(
    {"BULK_RECORDER_COMPILE", "BULK_RECORDER_REVISION", "BULK_RECORDER_SECRETS"}
)


def setting_names() -> frozenset[str]:
    """Every variable a setting reads: each field's name, and the ``_FILE`` forms."""
    fields = {name.upper() for name in Settings.model_fields}
    return frozenset(fields | {name.upper() + "_FILE" for name in SECRET_FILE_SETTINGS})


def _otel_sdk_names() -> frozenset[str]:
    """The ``OTEL_*`` variables the OpenTelemetry SDK reads itself (its limits, its other
    signals): not ours to warn about."""
    from opentelemetry.sdk import environment_variables

    values = vars(environment_variables).values()
    return frozenset(v for v in values if isinstance(v, str) and v.startswith("OTEL_"))


def unknown_settings(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """(variable, the closest real name or None) for each variable of ``environ`` with a
    setting's prefix (in any case, as settings are read) that no setting reads."""
    known = setting_names()
    unread: list[tuple[str, str]] = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(SETTING_PREFIXES) or upper in known or upper in NOT_SETTINGS:
            continue
        unread.append((name, upper))
    if not unread:  # the usual start: the SDK's names (its package) are not even loaded
        return []
    sdk = _otel_sdk_names()
    candidates = sorted(known | sdk)
    found: list[tuple[str, str | None]] = []
    for name, upper in unread:
        if upper in sdk or upper.startswith("OTEL_PYTHON_"):  # the SDK's, the Python SDK's
            continue
        close = difflib.get_close_matches(upper, candidates, n=1)
        found.append((name, close[0] if close else None))
    return found


def warn_unknown_settings(environ: Mapping[str, str]) -> None:
    """One WARNING line for each variable :func:`unknown_settings` finds (after logging is set
    up, by the entrypoint, which gives its environment)."""
    for name, meant in unknown_settings(environ):
        if meant:
            log.warning("unknown setting %s (did you mean %s?)", name, meant)
        else:
            log.warning("unknown setting %s (no setting has that name: docs/settings.md)", name)
