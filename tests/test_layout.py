"""Repository layout and module ownership rules (STYLE.md, docs/DESIGN.md).

Dependencies point one way: leaves (`errors`, `protocol`) import nothing of
rq; the daemons (`queue`, `mgr`) never import each other; nothing in rq/
imports the CLI.  Checked with `ast` over every module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rqtest import REPO

RQ = REPO / "rq"


def rq_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("rq")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rq"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {name for name in found if name == "rq" or name.startswith("rq.")}


def module_files(prefix: str) -> list[Path]:
    target = RQ / prefix
    return sorted(target.rglob("*.py")) if target.is_dir() else [target.with_suffix(".py")]


@pytest.mark.parametrize("leaf", ["errors", "protocol", "jsonwire", "record"])
def test_leaves_import_no_rq_module_but_errors(leaf: str) -> None:
    allowed = {"rq.errors", "rq.errors.ProtocolError", "rq.jsonwire", "rq.jsonwire.dumps",
               "rq.jsonwire.loads", "rq.record", "rq.record.Record"}
    assert rq_imports(RQ / f"{leaf}.py") <= allowed


@pytest.mark.parametrize("owner,forbidden", [
    ("queue", "rq.mgr"), ("mgr", "rq.queue"), ("store.py", "rq.queue"), ("store.py", "rq.mgr"),
    ("fsops.py", "rq.store"), ("proc.py", "rq.store"), ("config.py", "rq.store"),
    *[(a, f"rq.{b}") for a in ("timers", "scandir", "mgr", "queue")
      for b in ("timers", "scandir", "mgr", "queue") if a != b],
    ("dirwatch.py", "rq.timers"), ("dirwatch.py", "rq.scandir"),
])
def test_daemons_and_layers_do_not_cross(owner: str, forbidden: str) -> None:
    for path in module_files(owner.removesuffix(".py")):
        bad = {m for m in rq_imports(path) if m == forbidden or m.startswith(forbidden + ".")}
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def test_only_cli_modules_import_the_cli() -> None:
    for path in RQ.rglob("*.py"):
        if path.name in ("cli.py", "__main__.py") or path.parent == RQ / "cli":
            continue
        assert not {m for m in rq_imports(path) if m == "rq.cli" or m.startswith("rq.cli.")}, path


def test_no_bare_fork_outside_proc() -> None:
    """Spawning goes through rq/proc.py only (STYLE habit 8)."""
    for path in RQ.rglob("*.py"):
        text = path.read_text()
        if path.name != "proc.py":
            assert "os.fork(" not in text and "posix_spawn(" not in text, path


def test_repository_config_has_no_config_json() -> None:
    """S1.1: a fresh checkout is never mistaken for an installed root."""
    assert not (REPO / "config" / "config.json").exists()
    assert (REPO / "config" / "config.json.example").exists()


def test_every_module_has_a_docstring() -> None:
    for path in RQ.rglob("*.py"):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc, f"{path.relative_to(REPO)} lacks a module docstring"


def module_names(package_dir: Path) -> dict[Path, str]:
    """Every module below `package_dir` by its dotted name (the package's own name is
    found by walking up through the folders that hold an `__init__.py`)."""
    top = package_dir
    while (top.parent / "__init__.py").exists():
        top = top.parent
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(top.parent).with_suffix("").parts
        names[path] = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return names


def imported_modules(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of `known` that `path` (module `name`) imports anywhere: at the top, under
    TYPE_CHECKING or inside a function, absolute or relative."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[:len(parts) - node.level + 1])
                source = f"{anchor}.{source}" if source else anchor
            submodules = {f"{source}.{a.name}" for a in node.names} & known
            found |= submodules or {source}
    return (found & known) - {name}


def import_cycles(package_dir: Path) -> list[list[str]]:
    """The groups of modules below `package_dir` that import each other in a cycle (each
    reaches the others through imports), sorted; [] when the import graph is acyclic."""
    names = module_names(package_dir)
    graph = {name: imported_modules(path, name, set(names.values()))
             for path, name in names.items()}
    reach: dict[str, set[str]] = {}
    for start, imports in graph.items():
        seen: set[str] = set()
        todo = list(imports)
        while todo:
            node = todo.pop()
            if node not in seen:
                seen.add(node)
                todo.extend(graph[node])
        reach[start] = seen
    cycles = {tuple(sorted({m for m in reach[a] if a in reach[m]} | {a}))
              for a in graph if a in reach[a]}
    return sorted(list(c) for c in cycles)


def test_import_cycles_counts_every_kind_of_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "", "sub/__init__.py": "",
        "a.py": "from .b import x\n",                                   # relative
        "b.py": "def f():\n    from pkg import c\n",                  # function level
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n",
        "d.py": "from . import a\n",                                    # imports, not imported
        "sub/e.py": "from .. import d\nfrom . import f\n",
        "sub/f.py": "from pkg.sub.e import g\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    assert import_cycles(pkg) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.sub.e", "pkg.sub.f"]]
    assert import_cycles(pkg / "sub") == [["pkg.sub.e", "pkg.sub.f"]]
    (pkg / "sub" / "f.py").write_text("import pkg.d\n")
    (pkg / "c.py").write_text("")
    assert import_cycles(pkg) == []


@pytest.mark.parametrize("package", ["rq/queue", "rq/mgr", "rq/timers", "rq/scandir",
                                     "rq/builtin", "rq/analytics", "rq/cli"])
def test_no_import_cycles_within_a_package(package: str) -> None:
    """No module of the package imports one that (through others) imports it back,
    TYPE_CHECKING and function-level imports included (issue 14)."""
    assert import_cycles(REPO / package) == []


def test_the_queue_process_module_is_imported_by_its_entry_point_only() -> None:
    """rq/queue/process.py wires the queue's owners; nothing of rq.queue reaches back
    into it (issue 14: no service locator)."""
    for path in module_files("queue"):
        if path.name in ("process.py", "__main__.py"):
            continue
        assert "rq.queue.process" not in rq_imports(path), path


def test_no_module_over_500_lines() -> None:
    """Issue 14: modules of rq/ and web/ stay under 500 lines, process.py under 400."""
    sizes = {path: len(path.read_text().splitlines())
             for path in [*RQ.rglob("*.py"), *(REPO / "web").rglob("*.py")]}
    assert {str(p.relative_to(REPO)): n for p, n in sizes.items() if n > 500} == {}
    assert sizes[RQ / "queue" / "process.py"] < 400



def absolute_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_nothing_imports_a_top_level_web_package() -> None:
    """The web/ folder installs as `rq.web` (issue 14): relative imports inside it, `rq.web`
    everywhere else; a top-level `web` would collide with other distributions."""
    for top in ("rq", "web", "tests", "bench"):
        for path in (REPO / top).rglob("*.py"):
            bad = {m for m in absolute_imports(path) if m == "web" or m.startswith("web.")}
            assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def test_the_engine_does_not_import_the_web() -> None:
    """Dependencies point one way (STYLE layout): rq.web uses rq, never the reverse."""
    for path in RQ.rglob("*.py"):
        bad = {m for m in rq_imports(path) if m == "rq.web" or m.startswith("rq.web.")}
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def test_web_blueprints_do_not_import_each_other() -> None:
    """Blueprints share view helpers through web/views.py and web/queues.py (STYLE: one copy,
    like the Flask tutorial's get_db())."""
    web = REPO / "web"
    blueprints = {p.stem for p in web.glob("*.py") if "Blueprint(" in p.read_text()}
    for name in blueprints:
        tree = ast.parse((web / f"{name}.py").read_text())
        used = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                used |= {node.module} if node.module else {a.name for a in node.names}
        assert not used & blueprints, f"web/{name}.py imports {used & blueprints}"
