"""The layers of nodeagent/ (docs/architecture.md), checked from the imports, not from prose.

A package imports only packages of the layers below its own, plus the few sideways imports in
SIDEWAYS, each with its reason. Only coord/ imports redis, only gpu/ pynvml, only supervisor/
(and coord/embedded.py, the private redis-server) subprocess; nothing of the agent imports torch
or nodeagent.worker, and nodeagent.worker imports only channel/ (the formats it shares with the
agent). Only cli/ prints or exits, apart from the child programs in PROGRAMS. No import circle.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "nodeagent"

# Top first. `nodeagent` is the root package itself (its __version__); `__main__` is
# `python -m nodeagent`, a command line.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli", "__main__"),
    ("api",),  # the HTTP face (`nodeagent api` is a command line above it)
    ("runtime", "views"),  # views: what the verbs compute, below every face
    ("job", "pool"),
    ("supervisor", "telemetry", "gpu", "coord", "checkpoint", "accounting"),
    ("model", "channel", "config"),
    ("state", "errors", "nodeagent"),
)
SIDEWAYS: Mapping[tuple[str, str], str] = {
    ("__main__", "cli"): "`python -m nodeagent` is `nodeagent`",
    ("model", "config"): "a job spec is checked by the config's value rules and becomes a Config",
    ("telemetry", "gpu"): "the GPU gauges show the monitor's readings and verdicts",
    ("state", "errors"): "an illegal transition raises an InvariantError",
}
WORKER = "worker"  # what training scripts import: outside the layers, beside the agent
WORKER_MAY_IMPORT = frozenset({"worker", "channel"})
# What scripts of a framework import: nodeagent.worker for the framework's Trainer; the agent
# never imports it.
INTEGRATIONS = "integrations"
INTEGRATIONS_MAY_IMPORT = frozenset({"integrations", "worker", "channel"})
# The Python client of the API (nodeagent/client.py): what notebooks import, with httpx alone.
CLIENT = "client"
SCRIPT_SIDE = {
    WORKER: WORKER_MAY_IMPORT,
    INTEGRATIONS: INTEGRATIONS_MAY_IMPORT,
    CLIENT: frozenset({CLIENT}),
}
# Third-party modules only some packages (or modules) may import.
ONLY: Mapping[str, frozenset[str]] = {
    "redis": frozenset({"coord"}),
    "pynvml": frozenset({"gpu"}),
    "subprocess": frozenset({"supervisor", "nodeagent.coord.embedded"}),
    "torch": frozenset({WORKER, INTEGRATIONS}),
    "lightning": frozenset({INTEGRATIONS}),
    "transformers": frozenset({INTEGRATIONS}),
    "torchtitan": frozenset({INTEGRATIONS}),
    "fastapi": frozenset({"api"}),
    "starlette": frozenset({"api"}),
    "uvicorn": frozenset({"api"}),
    "pydantic": frozenset({"api"}),
    "httpx": frozenset({CLIENT}),
    "psycopg": frozenset({"accounting"}),
    "sqlite3": frozenset({"accounting"}),
}
# Programs of their own (a child process's main), which may print and exit like cli/.
PROGRAMS = frozenset(
    {
        "nodeagent.__main__",
        "nodeagent.supervisor.fence",
        "nodeagent.worker.preloaded",
        "nodeagent.checkpoint.persistcopy",
        "nodeagent.runtime.servechild",
    }
)
ROOT_MODULES = frozenset({"__init__", "__main__", "errors", "state", "client"})


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # what it imports, dotted (a nodeagent module, or a third-party top name)
    line: int
    top_level: bool  # at import time (not inside a function): what an import circle is made of


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """`job` for nodeagent.job.agent; `errors` for nodeagent.errors; `nodeagent` for the root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _targets(node: ast.Import | ast.ImportFrom, module: str, known: frozenset[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: resolved against the importing package
        package = module.split(".")[: -node.level]
        base = ".".join([*package, base] if base else package)
    # `from nodeagent.channel import beats` imports the module nodeagent.channel.beats
    return [
        f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
    ]


def _walk(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    def visit(node: ast.AST, top: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, top
            inner = not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from visit(child, top and inner)

    yield from visit(tree, True)


def scan(root: Path = ROOT) -> dict[str, list[Import]]:
    """Every module of the tree under `root` and what it imports (lazy imports too)."""
    paths = sorted(root.rglob("*.py"))
    known = frozenset(module_name(p) for p in paths)
    graph: dict[str, list[Import]] = {}
    for path in paths:
        module = module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        graph[module] = [
            Import(module, target, node.lineno, top)
            for node, top in _walk(tree)
            for target in _targets(node, module, known)
        ]
    return graph


def _rank(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def upward(graph: Mapping[str, Sequence[Import]]) -> list[str]:
    """Each import that does not point down, as 'module:line imports target (why not)'. Pure."""
    found = []
    for module, imports in graph.items():
        mine = package_of(module)
        for imp in imports:
            if not imp.target.startswith("nodeagent"):
                continue
            theirs = package_of(imp.target)
            where = f"{module}:{imp.line} imports {imp.target}"
            if mine == theirs:
                continue
            if mine in SCRIPT_SIDE or theirs in SCRIPT_SIDE:
                if mine not in SCRIPT_SIDE or theirs not in SCRIPT_SIDE[mine]:
                    found.append(f"{where} (nodeagent.worker and the agent share only channel/)")
                continue
            if _rank(theirs) > _rank(mine) or (mine, theirs) in SIDEWAYS:
                continue
            side = "sideways" if _rank(theirs) == _rank(mine) else "upwards"
            found.append(f"{where} ({mine} -> {theirs} points {side})")
    return found


def forbidden(graph: Mapping[str, Sequence[Import]]) -> list[str]:
    """Each import of a third-party module (ONLY) by a module not allowed it. Pure."""
    found = []
    for module, imports in graph.items():
        for imp in imports:
            allowed = ONLY.get(imp.target.split(".")[0])
            if allowed is not None and not ({package_of(module), module} & allowed):
                found.append(f"{module}:{imp.line} imports {imp.target} (only {sorted(allowed)})")
    return found


def circles(graph: Mapping[str, Sequence[Import]]) -> list[list[str]]:
    """The import circles among the modules (imports made at import time). Pure (Tarjan)."""
    edges = {
        m: sorted({i.target for i in imps if i.top_level and i.target in graph} - {m})
        for m, imps in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


def _calls(tree: ast.Module, names: frozenset[str]) -> Iterator[int]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            yield node.lineno
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id == "SystemExit":
                yield node.lineno


def _graph(edges: Mapping[str, Sequence[str]]) -> dict[str, list[Import]]:
    return {m: [Import(m, t, 1, True) for t in targets] for m, targets in edges.items()}


# The checks against the tree as it is.


def test_every_import_points_down() -> None:
    assert upward(scan()) == []


def test_third_party_modules_stay_in_their_package() -> None:
    assert forbidden(scan()) == []


def test_no_import_circle() -> None:
    assert circles(scan()) == []


def test_the_root_holds_only_packages_errors_and_state() -> None:
    modules = {p.stem for p in ROOT.glob("*.py")}
    assert modules <= ROOT_MODULES, sorted(modules - ROOT_MODULES)
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    layered = {name for layer in LAYERS for name in layer} | set(SCRIPT_SIDE)
    assert packages <= layered, f"a package in no layer: {sorted(packages - layered)}"


def unnamed(package: Path) -> list[str]:
    """The modules (`name.py`) and subpackages (`name/`) of `package` its docstring does not
    name: the package's docstring is the map of what it holds."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    held = [p.name for p in package.glob("*.py") if p.name != "__init__.py"]
    held += [f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").exists()]
    return sorted(name for name in held if not re.search(rf"(?<![\w/.]){re.escape(name)}", doc))


def test_every_package_names_every_module_it_holds() -> None:
    found = {
        module_name(init): missing
        for init in sorted(ROOT.rglob("__init__.py"))
        if (missing := unnamed(init.parent))
    }
    assert found == {}, "name each in its package's docstring (what it holds, in a few words)"


def test_only_the_command_lines_print_or_exit() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        module = module_name(path)
        if package_of(module) == "cli" or module in PROGRAMS:
            continue
        tree = ast.parse(path.read_text())
        found += [f"{module}:{line}" for line in _calls(tree, frozenset({"print", "exit"}))]
    assert found == []


def test_no_test_module_imports_another() -> None:
    """What tests share lives in tests/helpers/: a test module imported by another runs its
    module-level code (and fixtures) twice and ties two files' names together."""
    tests = ROOT.parent / "tests"
    found = []
    for path in sorted(tests.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node, _ in _walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            hits = [n for n in names if n.startswith("tests.") and ".test_" in n]
            if hits:
                found.append(f"{path.relative_to(tests)}:{node.lineno} imports {hits[0]}")
    assert found == []


# The checks themselves: each catches what it is for (so a green run above means something).


def test_an_upward_import_is_caught() -> None:
    graph = _graph(
        {
            "nodeagent.model.job": ["nodeagent.job.plan"],  # model is below job
            "nodeagent.job.plan": ["nodeagent.model.job", "nodeagent.errors"],  # down: fine
            "nodeagent.job.agent": ["nodeagent.pool.member"],  # a peer, not in SIDEWAYS
            "nodeagent.supervisor.group": ["nodeagent.worker.progress"],
            "nodeagent.worker.elastic": ["nodeagent.channel.control", "nodeagent.coord.keys"],
            "nodeagent.telemetry.metrics": ["nodeagent.gpu.readings"],  # SIDEWAYS: fine
        }
    )
    assert upward(graph) == [
        "nodeagent.model.job:1 imports nodeagent.job.plan (model -> job points upwards)",
        "nodeagent.job.agent:1 imports nodeagent.pool.member (job -> pool points sideways)",
        "nodeagent.supervisor.group:1 imports nodeagent.worker.progress "
        "(nodeagent.worker and the agent share only channel/)",
        "nodeagent.worker.elastic:1 imports nodeagent.coord.keys "
        "(nodeagent.worker and the agent share only channel/)",
    ]


def test_a_third_party_import_out_of_place_is_caught() -> None:
    graph = _graph(
        {
            "nodeagent.job.agent": ["redis", "subprocess"],
            "nodeagent.coord.store": ["redis"],
            "nodeagent.coord.embedded": ["subprocess"],
            "nodeagent.runtime.preflight": ["pynvml"],
            "nodeagent.worker.checkpoint": ["torch.distributed"],
        }
    )
    assert forbidden(graph) == [
        "nodeagent.job.agent:1 imports redis (only ['coord'])",
        "nodeagent.job.agent:1 imports subprocess "
        "(only ['nodeagent.coord.embedded', 'supervisor'])",
        "nodeagent.runtime.preflight:1 imports pynvml (only ['gpu'])",
    ]


def test_a_circle_is_caught_and_a_lazy_import_breaks_none() -> None:
    graph = _graph({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]})
    assert circles(graph) == [["a", "b", "c"]]
    graph["c"] = [Import("c", "a", 9, top_level=False)]  # inside a function
    assert circles(graph) == []


def unmapped(page: str, root: Path = ROOT) -> list[str]:
    """The modules docs/architecture.md does not name, each as `name.py` in backticks, in their
    package's row of its table (the row that starts with the package, as `job/checkpoints/`;
    the root's modules share the row that starts with `state.py`)."""
    rows = {
        match.group(1): line
        for line in page.splitlines()
        if (match := re.match(r"\| `([\w/.]+)`", line))
    }
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        package = path.parent.relative_to(root).as_posix()
        row = rows.get(f"{package}/" if package != "." else "state.py", "")
        if f"`{path.name}`" not in row:
            found.append(path.relative_to(root).as_posix())
    return found


def test_the_architecture_page_names_every_module_in_its_package_row() -> None:
    page = (ROOT.parent / "docs" / "architecture.md").read_text()
    assert unmapped(page) == []


def test_a_module_the_architecture_page_leaves_out_is_caught(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    for name in ("job/plan.py", "job/lease.py", "job/__init__.py", "state.py"):
        (tmp_path / name).write_text("")
    page = "| `job/` | `plan.py` (the leader); lease.py unquoted |\n| `state.py` | the enums |\n"
    assert unmapped(page, tmp_path) == ["job/lease.py"]


def test_a_module_its_package_does_not_name_is_caught(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "inner").mkdir(parents=True)
    (package / "inner" / "__init__.py").write_text('"""Nothing."""\n')
    for name in ("plan.py", "replan.py", "lease.py"):
        (package / name).write_text("")
    (package / "__init__.py").write_text('"""plan.py (the leader), inner/ (more); not lease."""\n')
    assert unnamed(package) == ["lease.py", "replan.py"]  # replan.py is not plan.py


def test_lazy_and_package_imports_are_seen() -> None:
    source = (
        "from nodeagent.channel import beats\n"
        "def f() -> None:\n"
        "    import redis\n"
        "    from . import sibling\n"
    )
    module = ROOT / "job" / "example.py"
    tree = ast.parse(source)
    known = frozenset({"nodeagent.channel.beats", "nodeagent.job.sibling"})
    found = [
        (target, top)
        for node, top in _walk(tree)
        for target in _targets(node, module_name(module), known)
    ]
    assert found == [
        ("nodeagent.channel.beats", True),
        ("redis", False),
        ("nodeagent.job.sibling", False),
    ]
