"""What ``bench/connect_stages.py`` and ``bench/latency_stages.py`` share:
a ``sitecustomize.py`` written into a folder on the nodes' ``PYTHONPATH``
wraps chosen modules as they are imported (:data:`FINDER`), so the nodes
run unchanged code and dump their timestamps into that folder;
:func:`run_traced` runs ``bench/cluster.py`` with it, :func:`quantiles`
prints what they measured.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

#: source of the import hook of a tracer: after its ``_PATCHES`` (module
#: name → ``patch(module)``, called once the module is executed), the
#: tracer installs it with ``sys.meta_path.insert(0, _Finder())``
FINDER = r'''
class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            patch(module)
        spec.loader.exec_module = patched
        return spec
'''


def quantiles(values: list, digits: int = 1) -> str:
    """:param values: durations, seconds.
    :returns: ``p50 / p90`` of ``values`` in ms with ``digits`` decimals,
        and their count; ``–`` when there are none."""
    if not values:
        return "–"
    values = sorted(values)
    return (f"{1e3 * values[len(values) // 2]:.{digits}f} / "
            f"{1e3 * values[int(len(values) * 0.9)]:.{digits}f} ({len(values)})")


def run_traced(tracer: str, env_name: str, prefix: str, args: list) -> str:
    """Run ``bench/cluster.py args`` with ``tracer`` (a ``sitecustomize.py``
    source) on the nodes' path, in a new folder under ``bench/out`` named
    by ``env_name`` (the environment variable the tracer reads).

    :returns: the folder, with what the nodes dumped there.
    :raises subprocess.CalledProcessError: when ``cluster.py`` fails."""
    os.makedirs(os.path.join(REPO, "bench", "out"), exist_ok=True)
    folder = tempfile.mkdtemp(prefix=prefix, dir=os.path.join(REPO, "bench", "out"))
    with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
        f.write(tracer)
    env = dict(os.environ, **{env_name: folder})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), folder) if p)
    subprocess.run([sys.executable, os.path.join(HERE, "cluster.py"), *args],
                   env=env, cwd=REPO, check=True)
    print(f"\ntraces: {folder}")
    return folder
