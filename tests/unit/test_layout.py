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


def _imports(path: pathlib.Path) -> set[str]:
    """Like :func:`imported_modules`, with ``from tbmq import ops`` read as
    ``tbmq.ops``."""
    names = imported_modules(path)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _offenders(paths, forbidden: str) -> dict[str, list[str]]:
    found = {}
    for path in paths:
        names = sorted(n for n in _imports(path) if n == forbidden
                       or n.startswith(forbidden + "."))
        if names:
            found[str(path.relative_to(ROOT.parent))] = names
    return found


def test_the_node_imports_nothing_of_ops():
    """Operations sit on the node, never under it (ARCHITECTURE §2): the
    broker, the cluster, the backends, the protocol and what they share
    (the node view, the timing of backend calls, authentication) import
    nothing of :mod:`tbmq.ops`, even lazily."""
    paths = [p for part in ("broker", "cluster", "backends", "mqtt", "auth")
             for p in (ROOT / part).rglob("*.py")]
    paths += [ROOT / "node_view.py", ROOT / "views.py", ROOT / "timing.py"]
    assert len(paths) > 30
    assert _offenders(paths, "tbmq.ops") == {}


def test_the_cli_and_the_api_share_code_from_below():
    """``tbmq credentials`` and the admin API build records with
    :mod:`tbmq.auth.records`; the API imports nothing of the CLI, and the
    shared module neither."""
    ops = list((ROOT / "ops").rglob("*.py"))
    assert _offenders(ops, "tbmq.cli") == {}
    records = ROOT / "auth" / "records.py"
    assert _offenders([records], "tbmq.cli") == {} and _offenders([records], "tbmq.ops") == {}
    assert "tbmq.auth.records" in _imports(ROOT / "ops" / "api" / "credentials.py")
    assert "tbmq.auth.records" in _imports(ROOT / "cli.py")


def test_ops_and_plugins_never_hold_the_broker():
    """Ops, ``$SYS`` and the event exporter read the node through
    :class:`tbmq.node_view.NodeView`: none imports the broker's composition
    root, and none reads a ``.broker`` attribute (the broker hands its
    view, ``Broker.view``, to the ops service and to the hooks)."""
    paths = list((ROOT / "ops").rglob("*.py")) + [ROOT / "events.py"]
    assert _offenders(paths, "tbmq.broker.broker") == {}
    reads = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "_broker":
                reads.setdefault(str(path.relative_to(ROOT.parent)), []).append(node.lineno)
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "broker" and path.name != "events.py"):
                reads.setdefault(str(path.relative_to(ROOT.parent)), []).append(node.lineno)
    assert reads == {}
    service = (ROOT / "service.py").read_text()
    assert "OpsService(self.broker.view, reactor)" in service
