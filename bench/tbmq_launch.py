"""Start ``twistd`` for the benchmark (``twistd`` has no ``__main__``).

When the runner benchmarks a committed revision extracted under
``bench/out/src-SHA`` (``run.py --tbmq-rev``), the environment's installed
``tbmq`` distribution may still advertise entry points (``tbmq`` group) of
the work tree that the revision does not have; those whose module does not
resolve inside the extracted tree are hidden, so the broker runs exactly the
revision's code.
"""

import importlib.metadata as md
import importlib.util
import os
import sys


def _inside(module: str, root: str) -> bool:
    try:
        spec = importlib.util.find_spec(module)
    except Exception:
        return False
    origin = getattr(spec, "origin", None) if spec else None
    return bool(origin) and os.path.abspath(origin).startswith(root + os.sep)


def _filter_entry_points(root: str) -> None:
    original = md.distributions

    class Dist:
        def __init__(self, dist):
            self._dist = dist

        def __getattr__(self, name):
            return getattr(self._dist, name)

        @property
        def entry_points(self):
            return [ep for ep in self._dist.entry_points
                    if ep.group != "tbmq" or _inside(ep.module, root)]

    def distributions(**kwargs):
        return (Dist(d) for d in original(**kwargs))

    md.distributions = distributions


src = os.environ.get("BENCH_TBMQ_SRC")
if src and os.path.basename(src).startswith("src-"):
    _filter_entry_points(os.path.abspath(src))

from twisted.scripts.twistd import run  # noqa: E402

sys.argv[0] = "twistd"
run()
