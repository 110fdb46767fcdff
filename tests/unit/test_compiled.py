"""The record rules run compiled (setup.py), and a build older than its source is caught."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from tests.compiled import REPO, compiled_sources, module_name, stale_builds

SUFFIX = ".so"


@pytest.mark.skipif(
    os.environ.get("BULK_RECORDER_COMPILE") == "0", reason="installed interpreted on purpose"
)
@pytest.mark.parametrize("source", compiled_sources(), ids=lambda p: p.stem)
def test_the_record_rules_run_compiled(source: Path) -> None:
    """A build that could not compile installs the sources with a warning only: this is what
    fails, so that `make test` never proves the interpreted code and ships the other."""
    module = importlib.import_module(module_name(source))
    assert (module.__file__ or "").endswith(SUFFIX), (
        f"{module.__name__} is interpreted ({module.__file__}): the build did not compile it "
        "(see make install's warning; BULK_RECORDER_COMPILE=0 says it is meant)"
    )


def _layout(root: Path) -> Path:
    (root / "setup.py").write_text('COMPILED = [\n    "pkg/rules.py",\n]\n')
    (root / "pkg").mkdir()
    source = root / "pkg" / "rules.py"
    source.write_text("X = 1\n")
    return source


def test_a_build_older_than_its_source_is_stale(tmp_path: Path) -> None:
    source = _layout(tmp_path)
    build = source.with_name("rules.cpython-311-x86_64-linux-gnu.so")
    build.write_bytes(b"")
    os.utime(build, (1_000, 1_000))
    assert stale_builds(tmp_path) == ["pkg.rules"]
    os.utime(build, (source.stat().st_mtime + 1,) * 2)
    assert stale_builds(tmp_path) == []


def test_a_source_without_a_build_is_not_stale(tmp_path: Path) -> None:
    _layout(tmp_path)
    assert stale_builds(tmp_path) == []


def test_the_repository_lists_what_it_compiles() -> None:
    names = [module_name(s) for s in compiled_sources()]
    assert "bulk_recorder.records.validation" in names
    assert all((REPO / s).is_file() for s in compiled_sources())
