"""What this build is: its version and the source revision it was built from.

The version is ``bulk_recorder.__version__`` (semantic versioning, docs/compatibility.md). The
revision is the commit the code came from, with ``-dirty`` when the checkout had uncommitted
changes to tracked files:

- an installed build (a wheel, the image) reads the package file ``REVISION``, stamped by
  setup.py at build time (``BULK_RECORDER_REVISION`` when set, as the image build passes it,
  else ``git rev-parse HEAD`` of the checkout being built);
- a checkout run in place (``make install`` is editable) asks git, so a commit made after the
  install is still named;
- neither says ``unknown``.

Two builds of different commits under one version are told apart by it.
"""

from __future__ import annotations

import subprocess
from functools import cache
from importlib import resources
from pathlib import Path

from bulk_recorder import __version__

UNKNOWN = "unknown"
_CHECKOUT = Path(__file__).resolve().parents[1]


@cache
def revision() -> str:
    """The source revision of the running code, or ``unknown``."""
    return _from_checkout(_CHECKOUT) or _stamped() or UNKNOWN


def describe() -> str:
    """``1.0.0 (revision 4dc0de7...)``: what ``--version`` and the start-up line say."""
    return f"{__version__} (revision {revision()})"


def _stamped() -> str:
    try:
        return resources.files("bulk_recorder").joinpath("REVISION").read_text().strip()
    except OSError:
        return ""


def _from_checkout(root: Path) -> str:
    """HEAD of the git checkout at ``root`` (``-dirty`` with tracked changes), else ``""``."""
    if not (root / ".git").exists():
        return ""
    git = ["git", "-C", str(root)]
    try:
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, check=True)
        changed = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head.stdout.decode().strip() + ("-dirty" if changed.stdout.strip() else "")
