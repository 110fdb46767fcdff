"""The documentation stands on its own: every relative link in README, CONTRIBUTING, CHANGELOG
and docs/ leads to a file of the repository, and every ``#anchor`` to a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "CHANGELOG.md", *REPO.glob("docs/*.md")]
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors: headings lower-cased, punctuation dropped, spaces as hyphens."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file_and_heading_of_the_repository(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not ours to check offline
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if REPO not in resolved.parents and resolved != REPO:
            broken.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no such heading)")
    assert broken == []


def test_no_file_of_the_project_cites_a_path_outside_it() -> None:
    """A clone is all a newcomer has: nothing may send them to a file the repository lacks."""
    import subprocess

    outside = ("DESIGN" + ".md", ".." + "/shared")
    files = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    citing = []
    for name in files:
        path = REPO / name
        if not path.is_file() or path.suffix in {".png", ".svg", ".lock"}:
            continue
        text = path.read_text(errors="replace")
        citing += [f"{name}: {what}" for what in outside if what in text]
    assert citing == []
