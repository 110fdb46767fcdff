"""The README and docs/ describe the product as it is today: each figure is today's, with the
command that reproduces it. Which issue asked for a change, what a figure was before it and what
moved it belong in CHANGELOG.md and benchmarks/RESULTS.md, never on these pages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted(REPO.glob("docs/*.md"))]

# "issue 30", "Issue 22", "issues 13 and 22", "issue #5", and an anchor made of one
# ("#as-the-tables-grow-issue-28"); the words may wrap onto the next line.
ISSUE = re.compile(r"\bissues?[\s-]+#?\d+", re.IGNORECASE)
# Phrases that only history uses: "(was 17.2)", "(before: read as 11-18 s", "since issue",
# "before this change", "1.45x before in the same rounds", "at the end of issue".
HISTORY = re.compile(
    r"\(was\s|\(before[:\s]|\bsince\s+issue\b|\bbefore\s+this\s+change\b"
    r"|\bbefore\s+in\s+the\s+same\s+rounds?\b|\bat\s+the\s+end\s+of\s+issue\b",
    re.IGNORECASE,
)


def findings(text: str) -> list[str]:
    """Each issue reference and history phrase in the text, with its line number."""
    found = []
    for pattern in (ISSUE, HISTORY):
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"line {line}: {' '.join(match.group(0).split())!r}")
    return sorted(found)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_page_cites_no_issue_and_tells_no_history(page: Path) -> None:
    assert findings(page.read_text()) == []


@pytest.mark.parametrize(
    "text",
    [
        "Issue 22 (the compiled decoder)",
        "measured after issues 13 and\n22",
        "[growth](performance.md#as-the-tables-grow-issue-28)",
        "see issue #5",
        "transaction **8.0 us** (was 17.2)",
        "0.44 s (before: read as 11-18 s)",
        "the install got faster since issue 30",
        "Before this change the relay waited",
        "1.45x before in the same rounds",
        "missed at the end of issue 30's work",
    ],
)
def test_history_and_issue_references_are_found(text: str) -> None:
    assert findings(text) != [], text


@pytest.mark.parametrize(
    "text",
    [
        "acked only after COMMIT, never before",
        "one that had not returned was never acked",
        "10 of the messages shown were no longer in the queue",
        "what was published, what PostgreSQL holds",
        "an issue with the broker is not bad data",
        "the issue tracker",
        "before 30 s have passed",
    ],
)
def test_product_statements_are_not_taken_for_history(text: str) -> None:
    assert findings(text) == []
