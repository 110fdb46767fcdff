"""Build hook: the record decoder's rules compiled with mypyc (the rest is in pyproject.toml).

The modules in ``COMPILED`` are the per-message rules that run after msgspec's pass
(``decode`` and its builders, the amount, date, document and metadata rules, the exact sums).
mypyc turns the same typed source into C extensions: no second implementation, the same tests
(docs/performance.md, "Compiled rules"). Compiled, decode + validate costs 0.95x a bare
``json.loads`` of a transaction's body and 0.82x of an annotation's (1.45x before, interpreted;
benchmarks/RESULTS.md section 20).

The compiled modules sit beside their sources (an editable install builds them in place) and
Python imports an extension before a ``.py`` of the same name: after editing one of these
sources, ``make install`` (which ``make test`` runs) builds it again, and the test session
refuses to start on a stale build (tests/conftest.py).

``BULK_RECORDER_COMPILE=0`` installs them interpreted. A build that cannot compile (no C
compiler, no Python headers) warns and installs them interpreted too: the service behaves the
same, only slower, and tests/unit/test_compiled.py fails on such an install unless the variable
says it was meant.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

COMPILED = [
    "bulk_recorder/records/validation.py",
    "bulk_recorder/records/rules.py",
    "bulk_recorder/records/documents.py",
    "bulk_recorder/records/exact.py",
]


def _warn(message: str) -> None:
    print(f"bulk-recorder: {message}; the record rules stay interpreted (slower)", file=sys.stderr)


class _OptionalBuildExt(build_ext):
    """Compile if this machine can; otherwise warn and install the interpreted modules."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, no headers: the sources still work
            _warn(f"could not compile ({exc})")

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            _warn(f"could not compile {ext.name} ({exc})")


def _stamp_revision() -> None:
    """Write the source revision into the package (bulk_recorder/build.py reads it).

    ``BULK_RECORDER_REVISION`` first (the image build has no .git), else the checkout's
    ``git rev-parse HEAD``, ``-dirty`` when it has uncommitted changes; neither (an sdist being
    built into a wheel) keeps the file the sdist carries.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    stamp = os.path.join(here, "bulk_recorder", "REVISION")
    revision = os.environ.get("BULK_RECORDER_REVISION", "").strip()
    if not revision and os.path.isdir(os.path.join(here, ".git")):
        git = ["git", "-C", here]
        try:
            head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, check=True)
            changed = subprocess.run(
                [*git, "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                check=True,
            )
        except (OSError, subprocess.CalledProcessError):
            return
        revision = head.stdout.decode().strip() + ("-dirty" if changed.stdout.strip() else "")
    if revision:
        with open(stamp, "w") as file:
            file.write(revision + "\n")


def _ext_modules() -> list[Any]:
    if os.environ.get("BULK_RECORDER_COMPILE", "1") == "0":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("mypyc is not installed")
        return []
    # Not the project's [tool.mypy] (its plugin is not in the build environment): these modules
    # need only their own types and msgspec's, a build requirement.
    options = ["--config-file", "", "--ignore-missing-imports"]
    return list(mypycify([*options, *COMPILED], opt_level="3"))


_stamp_revision()
setup(ext_modules=_ext_modules(), cmdclass={"build_ext": _OptionalBuildExt})
