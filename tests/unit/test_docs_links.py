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


# Paths of the repository as the docs cite them: `bulk_recorder/infra/db.py`, `tests/faults/`,
# `deploy/kubernetes/base` (with ::test or :line after them dropped).
CITED_PATH = re.compile(
    r"(?<![\w/.-])((?:bulk_recorder|consumer|tests|benchmarks|deploy|docs)/[\w./-]*[\w/])"
)
CITING_PAGES = [*PAGES, REPO / "benchmarks" / "RESULTS.md"]


def _ignored_by_git(path: str) -> bool:
    """An output path the docs name (benchmarks/out/): in .gitignore, so no clone has it."""
    import fnmatch

    for line in (REPO / ".gitignore").read_text().splitlines():
        entry = line.strip().lstrip("/")
        if not entry or entry.startswith("#"):
            continue
        if path.startswith(entry) if entry.endswith("/") else fnmatch.fnmatch(path, entry):
            return True
    return False


@pytest.mark.parametrize("page", CITING_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_a_page_cites_exists(page: Path) -> None:
    """A module moved or renamed leaves no page pointing at where it was."""
    missing = set()
    text = page.read_text()
    for match in CITED_PATH.finditer(text):
        path = match.group(1).rstrip(".")
        if text[match.end() : match.end() + 1] == "<":
            continue  # a pattern (bulk_recorder/sql/00N_<type>.sql), not a file
        if not (REPO / path).exists() and not _ignored_by_git(path):
            missing.add(path)
    assert sorted(missing) == []


# A comment's citation of a page and, optionally, its section: README "Least privilege",
# docs/security.md "Least privilege", docs/operations.md#scaling-out, docs/settings.md.
DOC_REFERENCE = re.compile(
    r"\b(README(?:\.md)?|CONTRIBUTING\.md|docs/[\w-]+\.md)(?:#([\w-]+)|,?\s+\"([^\"]+)\")?"
)


def _deploy_files() -> list[Path]:
    files = [REPO / "Dockerfile", REPO / "docker-compose.yml"]
    files += [p for p in sorted((REPO / "deploy").rglob("*")) if p.is_file()]
    return files


def _has_section(page: Path, anchor: str | None, title: str | None) -> bool:
    """The page has the heading: by its GitHub anchor, or by its title as written."""
    if anchor:
        return anchor in anchors(page)
    if title:
        lines = page.read_text().splitlines()
        return any(line.lstrip("#").strip() == title for line in lines if line.startswith("#"))
    return True


def test_every_page_and_section_the_deploy_files_cite_exists() -> None:
    """The manifests, compose file, alerts and dashboard cite docs by file and section title;
    both must be there (the README's old sections moved to docs/)."""
    broken = []
    for path in _deploy_files():
        # Comments wrap: join a line with the comment that continues it.
        text = re.sub(r"\n\s*#\s*", " ", path.read_text())
        for match in DOC_REFERENCE.finditer(text):
            name, anchor, title = match.groups()
            page = REPO / (name if name.endswith(".md") else f"{name}.md")
            where = f"{path.relative_to(REPO)}: {match.group(0)}"
            if not page.is_file():
                broken.append(f"{where} (no such file)")
            elif not _has_section(page, anchor, title):
                broken.append(f"{where} (no such heading)")
    assert broken == []


def _options(parser: object, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], set[str]]:
    """Command path ('dlq', 'replay') -> its long options, for every (sub)command."""
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    found: dict[tuple[str, ...], set[str]] = {}
    own = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(_options(sub, (*path, name)))
        elif not isinstance(action, argparse._HelpAction):
            own |= {o for o in action.option_strings if o.startswith("--")}
    if path:
        found[path] = own
    return found


def test_every_option_of_every_command_is_in_the_reference() -> None:
    """docs/reference.md's Commands table names every option argparse accepts, in the row of
    its command."""
    from consumer.cli import build_parser

    rows = [
        line
        for line in (REPO / "docs" / "reference.md").read_text().splitlines()
        if line.startswith("| `")
    ]
    missing = []
    for path, options in _options(build_parser()).items():
        mine = [row for row in rows if row.split("|")[1].strip().startswith(f"`{path[0]}")]
        if not mine:
            missing.append(f"{' '.join(path)} (no row)")
            continue
        text = " ".join(mine)
        missing += [
            f"{' '.join(path)} {option}" for option in sorted(options) if option not in text
        ]
    assert missing == []
