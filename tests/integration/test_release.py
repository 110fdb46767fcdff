"""`make release` (scripts/release.sh), run on a clone of this commit without its final tag.

The dry run checks, builds the sdist and the wheel, installs the wheel in a fresh virtualenv
(its record rules compiled, its `--version` naming this version and commit) and stops before
the tag; each refusal stops it before anything is built.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import bulk_recorder

REPO = Path(__file__).resolve().parents[2]
VERSION = bulk_recorder.__version__


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """This repository's HEAD, cloned: a clean tree with no tag."""
    target = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(target)], check=True)
    for tag in _git(target, "tag", "--list").split():
        _git(target, "tag", "--delete", tag)
    return target


def _release(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "UV": str(Path(sys.executable).parent / "uv"),
    }
    return subprocess.run(
        ["bash", "scripts/release.sh", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_dry_run_builds_installs_the_compiled_wheel_and_does_not_tag(clone: Path) -> None:
    head = _git(clone, "rev-parse", "HEAD")
    done = _release(clone, "--dry-run", "--no-image")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"release: bulk-recorder {VERSION} at {head}"
    says = f"bulk-recorder {VERSION} (revision {head})"
    assert f"release: the wheel installs, compiled, and says: {says}" in lines, lines
    assert lines[-1] == "release: dry run, not tagged"
    built = sorted(path.name for path in (clone / "dist").iterdir())
    assert f"bulk_recorder-{VERSION}.tar.gz" in built, built
    assert any(
        name.startswith(f"bulk_recorder-{VERSION}-") and name.endswith(".whl") for name in built
    )
    assert _git(clone, "tag", "--list") == ""
    assert _git(clone, "status", "--porcelain") == "", "the release left the tree changed"


def test_a_tree_with_changes_is_not_released(clone: Path) -> None:
    (clone / "README.md").write_text("changed\n")
    done = _release(clone, "--dry-run", "--no-image")
    assert done.returncode == 1
    assert "the tree is not clean" in done.stderr
    assert not (clone / "dist").exists()
    _git(clone, "checkout", "--", "README.md")
    (clone / "untracked.txt").write_text("not ignored\n")
    done = _release(clone, "--dry-run", "--no-image")
    assert done.returncode == 1
    assert "the tree is not clean" in done.stderr


@pytest.mark.parametrize(
    ("tag", "reason"),
    [
        (f"v{VERSION}", "is already tagged"),
        ("v999.0.0", "is not newer than the last release v999.0.0"),
    ],
)
def test_a_version_that_is_not_new_is_not_released(clone: Path, tag: str, reason: str) -> None:
    _git(clone, "tag", "-a", tag, "-m", "earlier")
    done = _release(clone, "--dry-run", "--no-image")
    assert done.returncode == 1
    assert reason in done.stderr, done.stderr
    assert not (clone / "dist").exists()


def test_an_unknown_option_stops_before_anything(clone: Path) -> None:
    done = _release(clone, "--bogus")
    assert done.returncode == 2
    assert "unknown option --bogus" in done.stderr


@pytest.mark.parametrize(
    "earlier",
    [
        (),
        # ordered as versions, not as text (0.10.0 is newer than 0.9.0, older than 1.0.0), and
        # a pre-release tag is not a release
        ("v0.9.0", "v0.10.0", f"v{VERSION}-rc1"),
    ],
)
def test_a_version_without_its_changelog_section_is_not_released(
    clone: Path, earlier: tuple[str, ...]
) -> None:
    for tag in earlier:
        _git(clone, "tag", "-a", tag, "-m", "earlier")
    changelog = clone / "CHANGELOG.md"
    changelog.write_text(changelog.read_text().replace(f"## [{VERSION}]", "## [next]"))
    _git(clone, "commit", "--quiet", "--all", "-m", "no section")
    done = _release(clone, "--dry-run", "--no-image")
    assert done.returncode == 1
    # the last check before the build: the version checks above it passed
    assert done.stderr == f"release: CHANGELOG.md has no '## [{VERSION}]' section\n"
    assert not (clone / "dist").exists()
