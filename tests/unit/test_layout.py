"""The layout's rules, read from the source: sizes, import edges, who may touch aiormq's insides.

- no module of the service (``bulk_recorder/``, ``consumer/``, ``settings.py``) over
  ``MAX_MODULE_LINES`` lines, no function over ``MAX_FUNCTION_LINES`` (the exceptions are listed
  in ``LONG_FUNCTIONS``, each with its reason);
- no import circle between the service's modules (imports inside functions count too);
- dependencies point one way: settings -> infra -> records -> recorder -> producer -> the
  service (``consumer``) -> its tools -> the CLI (``LAYERS``);
- only ``bulk_recorder/infra/aiormq_internals.py`` names aiormq's and pamqp's private attributes.

Each checker is also run on a small made-up source that breaks its rule, so a checker that
stopped seeing anything would fail here too.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVICE = ("bulk_recorder", "consumer", "settings.py")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
ADAPTER = "bulk_recorder/infra/aiormq_internals.py"

# Module prefix -> layer; the longest prefix wins. A module may import its own layer and below.
LAYERS: dict[str, int] = {
    "settings": 0,
    # the package's own __init__ (a docstring and a version) and bulk_recorder.exceptions (the
    # base every error of the service derives from, SettingsError included)
    "bulk_recorder": 0,
    "bulk_recorder.infra": 1,
    "bulk_recorder.records": 2,
    "bulk_recorder.recorder": 3,
    "bulk_recorder.producer": 4,  # the API's sync mode writes through recorder.writer
    "consumer": 5,
    "consumer.tools": 6,
    "consumer.cli": 7,
    "consumer.__main__": 7,
}

# Functions allowed past MAX_FUNCTION_LINES, with the reason. Keep this list short.
LONG_FUNCTIONS: dict[str, str] = {
    "consumer/tools/demo.py::_drive": "the demo's watch loop (71 lines): publish, poll, draw, stop",
}

# aiormq/pamqp internals: the connection's write queue and channel map, the frame codec the
# writer takes, the channel's private close event, and its delivery reader's steps.
PRIVATE_NAMES = frozenset(
    {"write_queue", "channels", "marshall", "ChannelFrame", "_on_deliver_frame", "_read_content"}
)
PRIVATE_PREFIXES = ("_Channel__", "_Connection__")


def _service_files() -> list[Path]:
    files: list[Path] = []
    for entry in SERVICE:
        path = REPO / entry
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(module: str, source: str, is_package: bool, known: set[str]) -> set[str]:
    """The known modules ``source`` imports, anywhere in it (functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    found.add(f"{base}.{alias.name}")
                elif base in known:
                    found.add(base)
    found.discard(module)
    return found


def _graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    known = set(sources)
    return {m: _imports(m, text, pkg, known) for m, (text, pkg) in sources.items()}


def _service_graph() -> dict[str, set[str]]:
    return _graph(
        {_module_name(p): (p.read_text(), p.name == "__init__.py") for p in _service_files()}
    )


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component larger than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def _upward_edges(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
        for m, targets in graph.items()
        for t in targets
        if _layer(t) > _layer(m)
    )


def _long_functions(source: str, where: str) -> dict[str, str]:
    """``path::name`` -> ``path:line name (N lines)`` for each function past the limit."""
    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                out[f"{where}::{node.name}"] = f"{where}:{node.lineno} {node.name} ({length} lines)"
    return out


def _private_uses(source: str) -> list[str]:
    """Every place ``source`` names an aiormq/pamqp private attribute."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        name: str | None = None
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.alias):
            name = node.name.rsplit(".", 1)[-1]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value if node.value.startswith(PRIVATE_PREFIXES) else None
        if name is not None and (name in PRIVATE_NAMES or name.startswith(PRIVATE_PREFIXES)):
            out.append((getattr(node, "lineno", 0), name))
    return [f"line {line}: {name}" for line, name in sorted(out)]


# -- the rules, on the real tree ------------------------------------------------------------


def test_no_service_module_is_over_the_line_limit() -> None:
    too_long = [
        f"{p.relative_to(REPO)} ({n} lines)"
        for p in _service_files()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not too_long, f"split these modules (limit {MAX_MODULE_LINES}): {too_long}"


def test_no_function_is_over_the_line_limit_but_the_listed_ones() -> None:
    found: dict[str, str] = {}
    for path in _service_files():
        found.update(_long_functions(path.read_text(), str(path.relative_to(REPO))))
    unexpected = [text for key, text in found.items() if key not in LONG_FUNCTIONS]
    stale = sorted(set(LONG_FUNCTIONS) - set(found))
    assert not unexpected, f"functions over {MAX_FUNCTION_LINES} lines: {unexpected}"
    assert not stale, f"listed as long but no longer are: {sorted(stale)}"


def test_the_service_has_no_import_circles() -> None:
    graph = _service_graph()
    assert len(graph) > 40  # the whole service was read
    assert _cycles(graph) == []


def test_dependencies_point_one_way() -> None:
    graph = _service_graph()
    assert all(_layer(m) >= 0 for m in graph)
    assert _upward_edges(graph) == []


def test_only_the_adapter_names_aiormq_private_attributes() -> None:
    offenders = {
        str(p.relative_to(REPO)): uses
        for p in _service_files()
        if str(p.relative_to(REPO)) != ADAPTER and (uses := _private_uses(p.read_text()))
    }
    assert offenders == {}
    assert _private_uses((REPO / ADAPTER).read_text())  # the adapter is where they are


# -- each checker sees a broken rule --------------------------------------------------------


def test_a_circle_is_found() -> None:
    graph = _graph(
        {
            "consumer.cli": ("from consumer.producer import cmd_api\n", False),
            "consumer.producer": ("def f():\n    from consumer.cli import run_async\n", False),
            "consumer.health": ("import consumer.cli\n", False),
        }
    )
    assert _cycles(graph) == [["consumer.cli", "consumer.producer"]]


def test_an_upward_import_is_found() -> None:
    graph = _graph(
        {
            "bulk_recorder.records.validation": ("from consumer.app import Recorder\n", False),
            "consumer.app": ("from bulk_recorder.records import decode\n", False),
            "bulk_recorder.records": ("", True),
        }
    )
    assert _upward_edges(graph) == [
        "bulk_recorder.records.validation (layer 2) imports consumer.app (layer 5)"
    ]


def test_a_relative_import_is_resolved() -> None:
    graph = _graph(
        {
            "bulk_recorder.infra.db": ("from ..recorder import flusher\n", False),
            "bulk_recorder.recorder.flusher": ("", False),
            "bulk_recorder.recorder": ("", True),
        }
    )
    assert graph["bulk_recorder.infra.db"] == {"bulk_recorder.recorder.flusher"}
    assert _upward_edges(graph) != []


def test_a_long_function_and_private_attributes_are_found() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert _long_functions(f"def f():\n{body}", "m.py") == {
        "m.py::f": f"m.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"
    }
    source = (
        "from aiormq.abc import ChannelFrame\n"
        "async def put(channel, frame):\n"
        "    await channel.connection.write_queue.put(frame)\n"
        "    return getattr(channel, '_Channel__close_event')\n"
    )
    assert _private_uses(source) == [
        "line 1: ChannelFrame",
        "line 3: write_queue",
        "line 4: _Channel__close_event",
    ]
