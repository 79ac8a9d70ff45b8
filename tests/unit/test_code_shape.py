"""The code's shape: no function over 60 lines and no class over 300 lines in engines/ and toolchain/, and no import
circle among their modules.

A circle counts every import, those inside functions too: a lazy import only hides a circle until the day its
function runs first. Sizes are what ``ast`` says (first line of the ``def``/``class`` to its last, decorators aside).
Each rule is also run on planted files, so that a broken checker cannot pass the code silently."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 300


def too_long(root: Path, base: Path = ROOT) -> list[str]:
    """``path:line name N lines (limit L)`` for each function or class under ``root`` over its limit."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    kind = "class" if isinstance(node, ast.ClassDef) else "function"
                    found.append(f"{path.relative_to(base)}:{node.lineno} {kind} {node.name} {lines} lines "
                                 f"(limit {limit})")
    return found


def module_names(base: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages`` (a package is its ``__init__``)."""
    names = {}
    for package in packages:
        for path in (base / package).rglob("*.py"):
            parts = path.relative_to(base).with_suffix("").parts
            names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports anywhere in its file: ``import a.b``, ``from a import
    b`` (b a module or a name of a), relative imports resolved against its package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        out |= {c for c in candidates if c in known and c != name}
    return out


def circles(base: Path, packages: tuple[str, ...]) -> list[list[str]]:
    """The import circles among the modules of ``packages``: each strongly connected set of two or more modules
    (Tarjan's algorithm, iterative), sorted."""
    known = module_names(base, packages)
    graph = {name: sorted(imports_of(name, path, known)) for name, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return sorted(found)


def test_no_function_over_60_lines_and_no_class_over_300_in_engines_or_toolchain():
    offenders = too_long(ROOT / "engines") + too_long(ROOT / "toolchain")
    assert not offenders, "too long (split them):\n" + "\n".join(offenders)


def test_no_import_circle_in_engines_or_toolchain():
    found = circles(ROOT, ("engines", "toolchain"))
    assert not found, "import circles (move what both need into a module of its own):\n" + \
        "\n".join(" <-> ".join(group) for group in found)


def test_the_checks_find_a_planted_long_function_and_a_planted_circle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n" + "    x = 1\n" * 60 + "\n\ndef g():\n" + "    x = 1\n" * 59 + "\n"
                              "class C:\n" + "    x = 1\n" * 299 + "\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def late():\n    from ..sub import c\n")  # lazy, still an edge
    (pkg / "sub" / "c.py").write_text("import pkg.sub.b\n")
    (pkg / "d.py").write_text("from pkg import a\n")  # imports a, nothing imports d: no circle
    assert too_long(pkg, tmp_path) == ["pkg/a.py:1 function f 61 lines (limit 60)"]
    (pkg / "a.py").write_text("class C:\n" + "    x = 1\n" * 300 + "\n")
    assert too_long(pkg, tmp_path) == ["pkg/a.py:1 class C 301 lines (limit 300)"]
    assert circles(tmp_path, ("pkg",)) == [["pkg.sub.b", "pkg.sub.c"]]
    (pkg / "a.py").write_text("from . import d\n")  # pkg -> a -> d -> pkg (d's "from pkg import a" names a)
    assert circles(tmp_path, ("pkg",)) == [["pkg", "pkg.a", "pkg.d"], ["pkg.sub.b", "pkg.sub.c"]]
