"""The package's import graph: no cycle, and the torch-free core imports nothing above it; and its
sizes: no module and no function past the bounds a reader can hold at once.

Read from the source with `ast`, so every import counts: module level, inside functions (the lazy
ones that keep `import laya_onnx` cheap) and under `TYPE_CHECKING`. `from a.b import c` is an
edge to the module `a.b.c` when there is one, else to `a.b` (import-linter's convention); a
package's `__init__` is a module like any other.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "laya_onnx"
#: What the core may never import: every layer above it.
ABOVE_CORE = ("export", "serve", "score", "bench", "parity", "cli", "checkpoints", "demo")
#: The most lines a module may have, and a function or method (its decorators aside, its
#: docstring included).
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 120


def modules(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) for every module under `package`."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its source."""
    mods = modules(package)

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in mods.items():
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importing module's package up
                    anchor = name if is_package else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in mods else known(base))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and "laya_onnx.export.exporter" in graph["laya_onnx.export"]
    assert cycles(graph) == []


def test_the_core_imports_nothing_above_it():
    above = tuple(f"laya_onnx.{layer}" for layer in ABOVE_CORE)
    wrong = {
        module: sorted(t for t in targets if t in above or t.startswith(tuple(a + "." for a in above)))
        for module, targets in import_graph(PACKAGE).items()
        if module == "laya_onnx.core" or module.startswith("laya_onnx.core.")
    }
    assert {module: targets for module, targets in wrong.items() if targets} == {}


def test_the_graph_sees_lazy_relative_and_type_checking_imports(tmp_path):
    """The checks above can fail: a cycle made only of imports inside functions, a relative
    import and one under TYPE_CHECKING is found."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def g():\n    from . import c\n")
    (pkg / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\n"
    )
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.sub.c"}
    assert graph["pkg.sub.c"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]


def oversized(package: Path) -> list[str]:
    """`path: N lines` for every module under `package` longer than MAX_MODULE_LINES, and
    `path:line name: N lines` for every function or method longer than MAX_FUNCTION_LINES."""
    found = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(package.parent)
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            found.append(f"{where}: {lines} lines (module; at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                span = (node.end_lineno or node.lineno) - node.lineno + 1
                if span > MAX_FUNCTION_LINES:
                    found.append(
                        f"{where}:{node.lineno} {node.name}: {span} lines (function; at most {MAX_FUNCTION_LINES})"
                    )
    return found


def test_no_module_or_function_is_oversized():
    found = oversized(PACKAGE)
    assert not found, "split along a concern:\n" + "\n".join(found)


def test_the_size_check_sees_a_long_module_and_a_long_method(tmp_path):
    """The check can fail: one line past each bound is found (a method, async, counts), and a
    function of exactly MAX_FUNCTION_LINES is not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    statements = ["x%d = %d" % (i, i) for i in range(MAX_FUNCTION_LINES)]
    long_method = "".join("        %s\n" % s for s in statements)
    (pkg / "long.py").write_text("class A:\n    async def run(self):\n" + long_method)
    (pkg / "fits.py").write_text("def f():\n" + "".join("    %s\n" % s for s in statements[1:]))
    (pkg / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert oversized(pkg) == [
        f"pkg/big.py: {MAX_MODULE_LINES + 1} lines (module; at most {MAX_MODULE_LINES})",
        f"pkg/long.py:2 run: {MAX_FUNCTION_LINES + 1} lines (function; at most {MAX_FUNCTION_LINES})",
    ]
