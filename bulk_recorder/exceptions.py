"""The one base of the service's errors, and the exit codes a command ends with.

Every exception class of the service derives from :class:`BulkRecorderError` and says, in
``exit_code``, how a command that it stops exits: :func:`consumer.cli.main` maps by class, in one
place, and prints the message in one line (the traceback at debug level). Each class is defined
beside the code that raises it, where its name tells what went wrong (``TopologyMismatch`` in
:mod:`bulk_recorder.infra.broker`, ``PortUnavailable`` in :mod:`consumer.health`); the driver
failures that mean "a service is away" are tuples in :mod:`bulk_recorder.infra.errors`.

This module is at the bottom layer, with ``settings.py``, so that ``SettingsError`` can derive
from the base too; it imports nothing of the service.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EXIT_SETTINGS", "EXIT_TOPOLOGY", "EXIT_UNREACHABLE", "BulkRecorderError"]

# The documented exit codes (docs/reference.md).
EXIT_UNREACHABLE: Final = 1  # a service cannot be reached, or refused what the command asked
EXIT_SETTINGS: Final = 2  # a setting or an argument is wrong, or a port is taken
EXIT_TOPOLOGY: Final = 3  # the broker has our queue or an exchange with other arguments


class BulkRecorderError(Exception):
    """An error of the service. ``exit_code``: how a command that this error stops exits."""

    exit_code: int = EXIT_UNREACHABLE
