"""The modules setup.py compiles, and whether a compiled build is older than its source.

Python imports ``rules.cpython-311-x86_64-linux-gnu.so`` before ``rules.py``: a test run after an
edit, without ``make install``, would test the old, compiled code and pass."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def compiled_sources(root: Path = REPO) -> list[Path]:
    """setup.py's ``COMPILED``, as paths under ``root``."""
    for node in ast.parse((root / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "COMPILED" for target in node.targets
        ):
            return [root / name for name in ast.literal_eval(node.value)]
    raise LookupError("setup.py has no COMPILED = [...]")


def module_name(source: Path, root: Path = REPO) -> str:
    return ".".join(source.relative_to(root).with_suffix("").parts)


def builds(source: Path) -> list[Path]:
    """The extension modules built from ``source`` (beside it, as an editable install puts them)."""
    return sorted(source.parent.glob(f"{source.stem}.*.so"))


def stale_builds(root: Path = REPO) -> list[str]:
    """The compiled modules whose build is older than their source, by module name."""
    stale = []
    for source in compiled_sources(root):
        if any(b.stat().st_mtime < source.stat().st_mtime for b in builds(source)):
            stale.append(module_name(source, root))
    return stale
