"""A build says what it is: the version and the source revision, wherever it is asked.

Two builds of different commits under one version are told apart by the revision: an installed
build reads the one setup.py stamped, a checkout asks git.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import bulk_recorder
from bulk_recorder import build

REPO = Path(__file__).resolve().parents[2]


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _commit(root: Path, text: str) -> str:
    (root / "file.txt").write_text(text)
    _git(root, "add", "file.txt")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", text)
    return _git(root, "rev-parse", "HEAD")


def test_two_commits_of_one_version_are_told_apart(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    first = _commit(tmp_path, "one")
    assert build._from_checkout(tmp_path) == first
    second = _commit(tmp_path, "two")
    assert build._from_checkout(tmp_path) == second != first
    (tmp_path / "file.txt").write_text("changed, not committed")
    assert build._from_checkout(tmp_path) == second + "-dirty"
    (tmp_path / "untracked.txt").write_text("an untracked file is not a change to the build")
    (tmp_path / "file.txt").write_text("two")
    assert build._from_checkout(tmp_path) == second


def test_outside_a_checkout_the_stamp_setup_py_wrote_is_read(tmp_path: Path) -> None:
    assert build._from_checkout(tmp_path) == ""  # no .git: the installed build's case
    package = tmp_path / "bulk_recorder"
    package.mkdir()
    (package / "__init__.py").write_text('__version__ = "9.9.9"\n')
    (package / "build.py").write_text((REPO / "bulk_recorder" / "build.py").read_text())
    (package / "REVISION").write_text("0123abc\n")
    probe = "from bulk_recorder.build import describe; print(describe())"

    def shown() -> str:
        # -S: without site-packages, so not the editable install but this copy (cwd) is found
        command = [sys.executable, "-S", "-c", probe]
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert shown() == "9.9.9 (revision 0123abc)"
    (package / "REVISION").unlink()
    assert shown() == "9.9.9 (revision unknown)"


def test_version_prints_the_version_and_this_checkouts_revision() -> None:
    done = subprocess.run(
        [Path(sys.executable).parent / "bulk-recorder", "--version"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    head = _git(REPO, "rev-parse", "HEAD")
    line = done.stdout.strip()
    assert line.startswith(f"bulk-recorder {bulk_recorder.__version__} (revision {head}"), line
    assert line == f"bulk-recorder {build.describe()}"


def test_the_version_is_semantic_and_one_place_gives_it() -> None:
    major, minor, patch = (int(part) for part in bulk_recorder.__version__.split("."))
    assert (major, minor, patch) >= (1, 0, 0)
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"ARG VERSION={bulk_recorder.__version__}\n" in dockerfile
