"""aioinfer's modules import one another without cycles and down the stack of rooms, read from the
source (no import is run).

Every ``import`` statement counts, the ones inside functions included: a lazy import that closes a
cycle still ties the two modules into one concept that cannot be read, tested or moved alone.
``if TYPE_CHECKING:`` blocks do not count (they never run). ``from aioinfer.x import y`` is an
edge to ``aioinfer.x``, and also to ``aioinfer.x.y`` when that is a module.

Importing ``aioinfer.x.y`` also runs the package ``aioinfer/x/__init__.py``, but that implied
edge is left out: it would make every lazy import in ``aioinfer/__init__.py`` (the public API's
``__getattr__``) a cycle with every module under it. Package ``__init__`` files that import
their submodules (``layers/triton_ops`` does, lazily) are therefore checked like any module.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "aioinfer"

# Cycles allowed to remain, each as the sorted tuple of its modules, with the reason. None now.
KNOWN_CYCLES: dict[tuple[str, ...], str] = {}


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(tree: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:  # the else branch does run
                    visit_one(stmt)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this module's package
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names
                         if f"{target}.{alias.name}" in modules)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.orelse:
                visit_one(stmt)
            return
        visit(node)

    visit(tree)
    return {name for name in found if name in modules and name != module}


def import_graph() -> dict[str, set[str]]:
    files = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        name, is_package = _module_name(path)
        files[name] = (path, is_package)
    modules = set(files)
    return {name: _imported(ast.parse(path.read_text(), str(path)), name, is_package, modules)
            for name, (path, is_package) in files.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Tarjan's algorithm, iterative; the components of more than one module (the cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[tuple[str, ...]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(tuple(sorted(component)))
    return cycles


def _describe(cycle: tuple[str, ...], graph: dict[str, set[str]]) -> str:
    members = set(cycle)
    edges = [f"    {a} -> {b}" for a in cycle for b in sorted(graph[a]) if b in members]
    return "\n".join(["cycle among " + ", ".join(cycle), *edges])


def test_the_graph_sees_lazy_imports_and_skips_type_checking():
    graph = import_graph()
    assert len(graph) > 50
    # Inside a function (model set-up fetches the default model only when asked for it).
    assert "aioinfer.fetch" in graph["aioinfer.executor.model_setup"]
    # Under ``if TYPE_CHECKING:`` only (the record builder names the channel's type, never imports it).
    assert "aioinfer.async_engine.request_channel" not in graph["aioinfer.async_engine.stats"]
    # ``from package import submodule`` reaches the submodule.
    assert "aioinfer.data_parallel.engine" in graph["aioinfer"]


def test_no_import_cycles():
    graph = import_graph()
    cycles = [c for c in strongly_connected(graph) if c not in KNOWN_CYCLES]
    assert not cycles, "import cycles among aioinfer's modules:\n" + "\n".join(_describe(c, graph) for c in cycles)
    stale = set(KNOWN_CYCLES) - set(strongly_connected(graph))
    assert not stale, f"KNOWN_CYCLES lists cycles that are gone: {sorted(stale)}"


def test_engine_packages_import_downwards_only():
    # text <- engine (sync core) <- async_engine <- data_parallel: each may import the ones before it.
    order = ["aioinfer.text", "aioinfer.engine", "aioinfer.async_engine", "aioinfer.data_parallel"]

    def layer(module: str):
        return next((i for i, pkg in enumerate(order) if module == pkg or module.startswith(pkg + ".")), None)

    graph = import_graph()
    upward = [f"{a} -> {b}" for a, targets in sorted(graph.items()) for b in sorted(targets)
              if layer(a) is not None and layer(b) is not None and layer(b) > layer(a)]
    assert not upward, "imports against the layering:\n" + "\n".join(upward)


# The whole stack, bottom to top (issue 57): a module may import its own room and the rooms of the
# levels below its own, never a room above. Rooms of one level are independent of each other, except
# for the arrows ``SIDEWAYS`` lists. ``distributed`` holds the collectives only (process groups,
# all-reduce kernels), which the split layers and the model loader use: it sits at the bottom, beside
# attention and core; the tensor-parallel runner, its processes and its step channel are the executor's.
# Rooms not placed in the stack yet (``spec_decode``, which core/ imports; ``text``, placed by the
# test above; ``utils``; the top-level modules) are not checked here.
STACK: list[tuple[str, ...]] = [
    ("aioinfer.attention", "aioinfer.core", "aioinfer.distributed"),
    ("aioinfer.layers",),
    ("aioinfer.models",),
    ("aioinfer.sample", "aioinfer.structured_output"),
    ("aioinfer.worker",),
    ("aioinfer.executor",),
    ("aioinfer.engine",),
    ("aioinfer.async_engine",),
    ("aioinfer.data_parallel", "aioinfer.ray"),
    ("aioinfer.entrypoints",),
]

# Arrows between two rooms of one level, (importer, imported): the one direction allowed, and why.
SIDEWAYS: dict[tuple[str, str], str] = {
    ("aioinfer.structured_output", "aioinfer.sample"):
        "the grammar-mask runtime shapes the logits the sampler sees: it builds on the sampler's per-row "
        "records (SamplingRow, SamplingMetadata, host_to_device) and its plain-greedy test; sampling "
        "knows nothing of grammars",
}

# Upward arrows still in the tree, (importing module, imported module): each with its reason. The test
# fails when one is gone, so that the list only shrinks.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}  # none left


def _stack_room(module: str) -> tuple[int, str] | None:
    for level, rooms in enumerate(STACK):
        for room in rooms:
            if module == room or module.startswith(room + "."):
                return level, room
    return None


def stack_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every (importer, imported) arrow that runs up the stack or sideways without leave."""
    found = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            room_a, room_b = _stack_room(a), _stack_room(b)
            if room_a is None or room_b is None or room_a[1] == room_b[1]:
                continue
            upward = room_b[0] > room_a[0]
            sideways = room_b[0] == room_a[0] and (room_a[1], room_b[1]) not in SIDEWAYS
            if upward or sideways:
                found.append((a, b))
    return found


def test_the_stack_imports_downwards_only():
    graph = import_graph()
    for rooms in STACK:
        for room in rooms:
            assert room in graph, f"{room} is in STACK but not in the tree"
    violations = stack_violations(graph)
    new = [f"    {a} -> {b}" for a, b in violations if (a, b) not in KNOWN_UPWARD]
    assert not new, "imports against the stack (bottom to top: " + " <- ".join(
        ", ".join(r.removeprefix("aioinfer.") for r in rooms) for rooms in STACK) + "):\n" + "\n".join(new)
    stale = sorted(set(KNOWN_UPWARD) - set(violations))
    assert not stale, f"KNOWN_UPWARD lists arrows that are gone: {stale}"
    for (a, b) in SIDEWAYS:
        level_a, level_b = _stack_room(a), _stack_room(b)
        assert level_a and level_b and level_a[0] == level_b[0], f"SIDEWAYS {a} -> {b} is not within one level"
        assert (b, a) not in SIDEWAYS, f"SIDEWAYS allows both {a} -> {b} and back"


def test_the_stack_check_catches_upward_and_sideways_arrows():
    graph = {"aioinfer.worker.model_runner": {"aioinfer.sample.sampler", "aioinfer.engine.engine_core"},
             "aioinfer.sample.sampler": {"aioinfer.structured_output.grammar_mask"},
             "aioinfer.structured_output.grammar_mask": {"aioinfer.sample.sampling_metadata"},
             "aioinfer.core.scheduler": {"aioinfer.attention.metadata"}}
    assert stack_violations(graph) == [("aioinfer.core.scheduler", "aioinfer.attention.metadata"),
                                       ("aioinfer.sample.sampler", "aioinfer.structured_output.grammar_mask"),
                                       ("aioinfer.worker.model_runner", "aioinfer.engine.engine_core")]


def test_the_engine_reaches_the_model_through_the_executor_only():
    # EngineCore drives an Executor (executor/abstract.py); the runner, the tensor-parallel processes
    # and the collectives are the executor's business, never imported by engine/ itself.
    graph = import_graph()
    reaching_in = [f"{a} -> {b}" for a, targets in sorted(graph.items()) if a.startswith("aioinfer.engine.")
                   for b in sorted(targets) if b.startswith(("aioinfer.worker", "aioinfer.distributed"))]
    assert not reaching_in, "engine/ imports below the executor:\n" + "\n".join(reaching_in)
