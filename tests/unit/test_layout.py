"""Rules of the layout (ARCHITECTURE §2) that a test can hold."""

from __future__ import annotations

import ast
import pathlib

import tbmq

ROOT = pathlib.Path(tbmq.__file__).parent


def imported_modules(path: pathlib.Path) -> set[str]:
    """:returns: every module name ``path`` imports, at any depth."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_the_core_never_imports_the_first_party_plugins():
    """``tbmq`` reaches its plugins through hooks only; the plugins import
    ``tbmq``, never the other way."""
    offenders = {
        str(path.relative_to(ROOT.parent)): sorted(
            name for name in imported_modules(path)
            if name == "tbmq_plugins" or name.startswith("tbmq_plugins."))
        for path in ROOT.rglob("*.py")
    }
    offenders = {path: names for path, names in offenders.items() if names}
    assert offenders == {}
    assert "tbmq.backends.credential_rows" in imported_modules(
        ROOT.parent / "plugins" / "tbmq_plugins" / "postgres.py")


#: the most lines a module of ``tbmq`` or ``tbmq_plugins`` may have: "no
#: module over about 800 lines" (a module past it is split by concern, as
#: :mod:`tbmq.config` is into its schema and its loading)
MAX_MODULE_LINES = 850


def test_no_module_is_much_over_800_lines():
    modules = list(ROOT.rglob("*.py")) + list((ROOT.parent / "plugins").rglob("*.py"))
    sizes = {str(path.relative_to(ROOT.parent)): len(path.read_text().splitlines())
             for path in modules}
    assert len(sizes) > 50
    assert {path: n for path, n in sizes.items() if n > MAX_MODULE_LINES} == {}
