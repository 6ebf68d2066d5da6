#!/usr/bin/env python3
"""Summarise a py-spy ``--format raw`` profile (collapsed stacks) as text.

    python bench/pyspy_top.py bench/out/profile-fanin_qos0-v4.raw [--top 12]

Prints the functions with the most samples *on CPU in the function itself*
(self) and, for tbmq's own functions, *in it or anything it called*
(inclusive), each with its hottest line, as a percentage of all samples
(py-spy leaves idle threads out). In CPython 3.11 a sample on a ``return``
line is mostly the frame's teardown (freeing its locals).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys

_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


def short(path: str) -> str:
    for marker in ("site-packages/", "/src-"):
        i = path.find(marker)
        if i >= 0:
            rest = path[i + len(marker):]
            return rest.split("/", 1)[1] if marker == "/src-" else rest
    if "/lib/python3" in path:
        return "stdlib/" + path.rsplit("/", 1)[-1]
    return path


def parse(path: str):
    stacks = []
    with open(path) as f:
        for raw in f:
            raw = raw.rstrip("\n")
            if not raw:
                continue
            stack, _, count = raw.rpartition(" ")
            frames = []
            for fr in stack.split(";"):
                m = _FRAME.match(fr)
                if m:
                    frames.append((m["name"], short(m["file"]), int(m["line"] or 0)))
                else:
                    frames.append((fr, "", 0))
            stacks.append((frames, int(count)))
    return stacks


#: leaf frames of threads waiting for work (the SQLite store's thread pool):
#: py-spy counts them when it pauses the process for each sample
IDLE_LEAVES = {("Condition.wait", "threading.py"), ("Event.wait", "threading.py"),
               ("EPollReactor.doPoll", "twisted/internet/epollreactor.py")}


def _idle(frame) -> bool:
    name, file, _ = frame
    return any(name == n and file.endswith(f) for n, f in IDLE_LEAVES)


def summarise(stacks, top: int = 12, prefix: str = "tbmq/") -> str:
    everything = sum(c for _, c in stacks)
    stacks = [(f, c) for f, c in stacks if f and not _idle(f[-1])]
    total = sum(c for _, c in stacks)
    self_fn = collections.Counter()
    self_line = collections.Counter()
    incl_fn = collections.Counter()
    incl_line = collections.Counter()
    for frames, count in stacks:
        if not frames:
            continue
        name, file, line = frames[-1]
        self_fn[(name, file)] += count
        self_line[(name, file, line)] += count
        seen = set()
        for name, file, line in frames:
            key = (name, file)
            if key not in seen:
                seen.add(key)
                incl_fn[key] += count
                incl_line[(name, file, line)] += count

    def hottest(counter, key):
        best = max(((k[2], c) for k, c in counter.items() if k[:2] == key), key=lambda x: x[1], default=(0, 0))
        return best[0]

    out = [f"{total} busy samples ({everything - total} idle-thread samples left out)", "",
           "self (on CPU in the function itself):", "",
           "| % | function | file:line (hottest) |", "|---|---|---|"]
    for key, c in self_fn.most_common(top):
        out.append(f"| {100 * c / total:.1f} | `{key[0]}` | `{key[1]}:{hottest(self_line, key)}` |")
    out += ["", f"inclusive (in the function or below it; functions of {prefix} only):", "",
            "| % | function | file:line (hottest call) |", "|---|---|---|"]
    ranked = [(k, c) for k, c in incl_fn.most_common() if k[1].startswith(prefix)]
    for key, c in ranked[:top]:
        out.append(f"| {100 * c / total:.1f} | `{key[0]}` | `{key[1]}:{hottest(incl_line, key)}` |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--prefix", default="tbmq/", help="inclusive list: only functions of files under this")
    args = ap.parse_args(argv)
    print(summarise(parse(args.profile), args.top, args.prefix))
    return 0


if __name__ == "__main__":
    sys.exit(main())
