"""Every reference a docstring or comment makes to our code resolves: a ``:mod:``, ``:class:``,
``:func:``, ``:meth:``, ``:data:``, ``:attr:`` or ``:exc:`` role, and any dotted name that
starts with one of our top-level modules (``bulk_recorder.``, ``consumer.``, ``settings.``).

Docstrings cited modules that had moved (``consumer.reach``, ``bulk_recorder.broker``), and
nothing noticed: the next maintainer followed them to nowhere.
"""

from __future__ import annotations

import importlib
import inspect
import re
import tokenize
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
OURS = ("bulk_recorder", "consumer", "settings")
SOURCES = sorted(
    [
        REPO / "settings.py",
        *(REPO / "bulk_recorder").rglob("*.py"),
        *(REPO / "consumer").rglob("*.py"),
    ]
)
ROLE = re.compile(r":(?:mod|class|func|meth|data|attr|exc):`~?([^`<]+?)`")
DOTTED = re.compile(r"(?<![\w./-])((?:bulk_recorder|consumer|settings)(?:\.[A-Za-z_]\w*)+)")
_MISSING = object()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve_dotted(name: str) -> bool:
    """``a.b.C.meth``: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            target = _member(target, attr)
            if target is _MISSING:
                return False
        return True
    return False


def _member(owner: Any, attr: str) -> Any:
    found = getattr(owner, attr, _MISSING)
    if found is _MISSING and inspect.isclass(owner):
        # dataclass fields with slots, and annotated attributes set in __init__
        declared = {*getattr(owner, "__annotations__", {}), *getattr(owner, "__slots__", ())}
        if attr in declared or attr in _init_attributes(owner):
            return object()
    return found


def _init_attributes(cls: type) -> set[str]:
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return set()
    return set(re.findall(r"self\.(\w+)\s*[:=]", source))


def resolve(name: str, module: ModuleType) -> bool:
    name = name.strip().rstrip("()")
    if name.startswith("."):
        package = module.__name__ if hasattr(module, "__path__") else module.__package__ or ""
        return resolve_dotted(package + name)
    head, _, rest = name.partition(".")
    if head in OURS or _is_module(head):
        return resolve_dotted(name)
    target: Any = getattr(module, head, _MISSING)
    if target is _MISSING:
        # a bare method name: a method of a class this module defines
        return not rest and any(
            hasattr(obj, head)
            for obj in vars(module).values()
            if inspect.isclass(obj) and obj.__module__ == module.__name__
        )
    for attr in rest.split(".") if rest else ():
        target = _member(target, attr)
        if target is _MISSING:
            return False
    return True


def _is_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        return False
    return True


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_reference_in_docstrings_and_comments_resolves(path: Path) -> None:
    name = module_name(path)
    # a __main__ runs its command when imported: resolve its references in its package
    module = importlib.import_module(name.removesuffix(".__main__"))
    text = prose(path)
    unresolved = sorted(
        {name for name in ROLE.findall(text) if not resolve(name, module)}
        | {name for name in DOTTED.findall(text) if not _dotted_ok(name)}
    )
    assert unresolved == []


def prose(path: Path) -> str:
    """The file's comments and triple-quoted strings (docstrings), where references live; code
    such as ``settings.database_url`` (a variable) is not prose."""
    out = []
    with path.open("rb") as source:
        for token in tokenize.tokenize(source.readline):
            if token.type == tokenize.COMMENT or (
                token.type == tokenize.STRING and token.string.lstrip("rbuRBU").startswith('"""')
            ):
                out.append(token.string)
    return "\n".join(out)


def _dotted_ok(name: str) -> bool:
    """A dotted name of ours in prose: a module, or an attribute of one. A file name
    (``settings.py``) is prose, not a reference."""
    if name.endswith((".py", ".sql", ".md", ".yml", ".json")):
        return True
    if name.startswith("settings.") and resolve_dotted("settings.Settings." + name[9:]):
        return True  # ``settings.x``: the field or property x of the settings object
    return resolve_dotted(name)
