"""Every locked runtime dependency's licence is listed in docs/licenses.md and allowed.

A new dependency, or a new version that changes its licence, fails here until the table (and,
for a licence outside the allowed set, a review) says so.
"""

from __future__ import annotations

import re
from importlib.metadata import distribution
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ALLOWED = frozenset(
    {"Apache-2.0", "MIT", "BSD-2-Clause", "BSD-3-Clause", "ISC", "PSF-2.0", "MPL-2.0"}
)
# Free-text ``License:`` fields of older metadata, in SPDX.
_FREE_TEXT = {
    "3-Clause BSD License": "BSD-3-Clause",
    "MIT License": "MIT",
    "Apache Software License": "Apache-2.0",
    "BSD License": "BSD-3-Clause",
}
_CLASSIFIERS = {
    "License :: OSI Approved :: Apache Software License": "Apache-2.0",
    "License :: OSI Approved :: MIT License": "MIT",
    "License :: OSI Approved :: Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
}
_LOCK_LINE = re.compile(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s\\;]+)")
_ROW = re.compile(r"^\| ([A-Za-z0-9_.\-]+) \| ([^ |]+) \| ([^|]+?) \|$")


def locked(lock: Path) -> dict[str, str]:
    """Package -> exact version, from a requirements lock file."""
    found = {}
    for line in lock.read_text().splitlines():
        match = _LOCK_LINE.match(line)
        if match:
            found[match.group(1).lower()] = match.group(2)
    return found


def listed(doc: Path) -> dict[str, tuple[str, str]]:
    """Package -> (version, SPDX expression), from the table of docs/licenses.md."""
    found = {}
    for line in doc.read_text().splitlines():
        match = _ROW.match(line)
        if match and match.group(1) != "package":
            found[match.group(1).lower()] = (match.group(2), match.group(3).strip())
    return found


def terms(expression: str) -> set[str]:
    """The licence identifiers of an SPDX expression (``A OR B``, ``A AND B``)."""
    return {t for t in re.split(r"\s+(?:AND|OR|WITH)\s+|[()]", expression) if t.strip()}


def refused(expression: str) -> set[str]:
    """The identifiers of ``expression`` outside the allowed set."""
    return {t.strip() for t in terms(expression)} - ALLOWED


def declared(package: str) -> set[str]:
    """What the installed package's own metadata says its licence is, in SPDX identifiers."""
    meta = distribution(package).metadata
    expression = meta["License-Expression"]
    if expression:
        return terms(expression)
    found = set()
    text = (meta["License"] or "").strip()
    if text:
        found.add(_FREE_TEXT.get(text, text))
    for classifier in meta.get_all("Classifier") or []:
        if classifier in _CLASSIFIERS:
            found.add(_CLASSIFIERS[classifier])
    return found


def test_every_locked_package_is_listed_with_its_locked_version() -> None:
    lock = locked(REPO / "requirements.lock")
    table = listed(REPO / "docs" / "licenses.md")
    assert lock, "requirements.lock has no pinned package"
    assert sorted(set(lock) - set(table)) == [], "locked but not in docs/licenses.md"
    assert sorted(set(table) - set(lock)) == [], "in docs/licenses.md but no longer locked"
    stale = {name: (table[name][0], v) for name, v in lock.items() if table[name][0] != v}
    assert stale == {}, "docs/licenses.md lists another version than the lock (listed, locked)"


def test_every_listed_licence_is_what_the_package_declares_and_is_allowed() -> None:
    for name, (_, expression) in listed(REPO / "docs" / "licenses.md").items():
        assert refused(expression) == set(), f"{name}: {expression} is not an allowed licence"
        missing = terms(expression) - declared(name)
        assert missing == set(), f"{name}: listed {expression}, its metadata says {declared(name)}"


def test_the_project_declares_its_own_licence() -> None:
    meta = distribution("bulk-recorder").metadata
    assert meta["License-Expression"] == "Apache-2.0"
    assert "Apache License" in (REPO / "LICENSE").read_text()[:200]
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in dockerfile


@pytest.mark.parametrize(
    ("expression", "refused_terms"),
    [
        ("MIT", set()),
        ("Apache-2.0 AND BSD-2-Clause", set()),
        ("MIT OR Apache-2.0", set()),
        ("GPL-3.0-only", {"GPL-3.0-only"}),
        ("MIT AND AGPL-3.0-or-later", {"AGPL-3.0-or-later"}),
        ("(LGPL-2.1-or-later OR MIT)", {"LGPL-2.1-or-later"}),
        ("Elastic-2.0", {"Elastic-2.0"}),
        ("SSPL-1.0", {"SSPL-1.0"}),
    ],
)
def test_a_dependency_under_a_licence_outside_the_set_is_refused(
    expression: str, refused_terms: set[str]
) -> None:
    assert refused(expression) == refused_terms
