"""Errors in one home: every exception class of the service derives from
:class:`bulk_recorder.exceptions.BulkRecorderError`, and each start-up failure carries the exit
code the CLI maps it to (docs/reference.md)."""

from __future__ import annotations

import importlib
import inspect

from bulk_recorder.exceptions import (
    EXIT_SETTINGS,
    EXIT_TOPOLOGY,
    EXIT_UNREACHABLE,
    BulkRecorderError,
)
from bulk_recorder.infra.broker import TopologyMismatch
from bulk_recorder.infra.migrate import MigrationRefused
from bulk_recorder.infra.reach import Unreachable
from bulk_recorder.infra.roles import RolesRefused
from bulk_recorder.producer.key_store import ApiKeyRefused
from consumer.health import PortUnavailable
from settings import SettingsError
from tests.unit.test_layout import _module_name, _service_files


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for path in _service_files():
        name = _module_name(path)
        if name.endswith("__main__"):
            continue  # running it would start a command
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == name
                and obj is not BulkRecorderError
            ):
                found[f"{name}.{attr}"] = obj
    return found


def test_every_exception_class_of_the_service_derives_from_one_base() -> None:
    classes = _exception_classes()
    assert len(classes) >= 18  # the whole service was read
    assert sorted(n for n, c in classes.items() if not issubclass(c, BulkRecorderError)) == []


def test_each_start_up_failure_carries_its_documented_exit_code() -> None:
    assert SettingsError.exit_code == EXIT_SETTINGS == 2
    assert PortUnavailable.exit_code == EXIT_SETTINGS
    assert TopologyMismatch.exit_code == EXIT_TOPOLOGY == 3
    assert Unreachable.exit_code == EXIT_UNREACHABLE == 1
    assert MigrationRefused.exit_code == RolesRefused.exit_code == EXIT_UNREACHABLE
    assert ApiKeyRefused("bad scope").exit_code == EXIT_SETTINGS
    assert ApiKeyRefused("none live", exit_code=EXIT_UNREACHABLE).exit_code == EXIT_UNREACHABLE
