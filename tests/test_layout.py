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


@pytest.mark.parametrize("leaf", ["errors", "protocol"])
def test_leaves_import_no_rq_module_but_errors(leaf: str) -> None:
    allowed = {"rq.errors", "rq.errors.ProtocolError"}
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
        if path.name in ("cli.py", "__main__.py"):
            continue
        assert "rq.cli" not in rq_imports(path), path


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
