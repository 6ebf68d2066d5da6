"""bench/connect_turns.py: the node of a tree runs that tree's code, and a
row tells the stops of the accept loops (wall time past CPU time)."""

from __future__ import annotations

import os
import subprocess
import sys

from bench import connect_turns

SCRIPT = os.path.abspath(connect_turns.__file__)


def test_the_node_of_a_tree_runs_its_launcher_with_that_trees_tbmq(tmp_path):
    (tmp_path / "tbmq").mkdir()
    (tmp_path / "tbmq" / "__init__.py").write_text("")
    launch = tmp_path / "launch.py"
    launch.write_text("import sys, tbmq\nprint(tbmq.__file__, sys.argv[1:])\n")
    out = subprocess.run(
        [sys.executable, SCRIPT, "--node", str(tmp_path / "turns.json"), str(launch), "-n", "x"],
        env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path,
        capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"{tmp_path / 'tbmq' / '__init__.py'} ['-n', 'x']"


def test_a_row_counts_the_loops_stopped_longer_than_they_ran():
    figures = {"rate": 10000.0, "p50_ms": 9.0, "p99_ms": 25.0, "run_queue_wait": 0.155,
               # (wall s, CPU s, accepted): one stopped 16 ms, one 1 ms (not a stop)
               "loops": [[0.020, 0.004, 80], [0.003, 0.002, 20]]}
    cells = [c.strip() for c in connect_turns.row("t", figures).strip("|").split("|")]
    assert cells == ["t", "10,000", "9.0", "25.0", "10.0", "2", "80", "60", "1; 16.0", "155"]
