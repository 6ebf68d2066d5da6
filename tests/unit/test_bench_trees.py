"""The benchmark runs the tree it is asked for: a node of a source tree
(``bench/cluster.py --trees``, ``bench/run.py --brokers tbmq@REV``) imports
that tree's ``tbmq`` and its first-party plugins (``plugins/``: the Kafka
bus, Redis, the auth providers), not those of the installed checkout."""

from __future__ import annotations

import subprocess
import sys

from bench.brokers import TreeTbmq, tree_pythonpath


def test_the_pythonpath_of_a_tree_puts_its_plugins_beside_its_tbmq():
    assert tree_pythonpath("/t", None).split(":") == ["/t", "/t/plugins"]
    assert tree_pythonpath("/t", "/x:/y").split(":") == ["/t", "/t/plugins", "/x", "/y"]


def test_a_node_of_a_tree_imports_that_trees_plugins(tmp_path, monkeypatch):
    (tmp_path / "out").mkdir()
    monkeypatch.setattr("bench.brokers.OUT", str(tmp_path / "out"))  # the node's directory
    for package in ("tbmq", "plugins/tbmq_plugins"):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
    node = TreeTbmq(src=str(tmp_path))
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import tbmq, tbmq_plugins; print(tbmq.__file__); "
                                   "print(tbmq_plugins.__file__)"],
            env=node.env(), cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split()
    finally:
        node.cleanup()
    assert out == [str(tmp_path / "tbmq" / "__init__.py"),
                   str(tmp_path / "plugins" / "tbmq_plugins" / "__init__.py")]
    assert node.env()["BENCH_TBMQ_SRC"] == str(tmp_path)
