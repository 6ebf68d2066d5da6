#!/usr/bin/env python3
"""The largest classes of tbmq by method count, their tbmq base classes
included (what one object of the class carries), read from the source with
``ast`` (nothing imported).

    python bench/class_sizes.py [--top 15] [--root tbmq]

Columns: methods defined in the class itself; methods with those of its
bases defined in tbmq (a name defined twice counts once); instance
attributes assigned as ``self.x = ...`` in those classes' methods.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys


def classes(root: str) -> dict[str, tuple[str, ast.ClassDef]]:
    """:returns: class name → (module path, its ``ClassDef``); a name
    defined twice keeps the first (bases are resolved by name)."""
    found: dict[str, tuple[str, ast.ClassDef]] = {}
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, (path, node))
    return found


def own(node: ast.ClassDef) -> tuple[set[str], set[str]]:
    methods = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    attrs = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            for t in targets:
                for e in ast.walk(t):
                    if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                        attrs.add(e.attr)
    return methods, attrs


def flattened(name: str, table: dict, seen=None) -> tuple[set[str], set[str], list[str]]:
    seen = set() if seen is None else seen
    if name in seen or name not in table:
        return set(), set(), []
    seen.add(name)
    methods, attrs = own(table[name][1])
    chain = [name]
    for base in table[name][1].bases:
        base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        m, a, c = flattened(base_name, table, seen)
        methods |= m
        attrs |= a
        chain += c
    return methods, attrs, chain


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                 "tbmq"))
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
    table = classes(args.root)
    rows = []
    for name, (path, node) in table.items():
        mine, _ = own(node)
        methods, attrs, chain = flattened(name, table)
        rows.append((len(methods), len(mine), len(attrs), name, os.path.relpath(path, os.path.dirname(args.root)),
                     " < ".join(chain[1:])))
    rows.sort(reverse=True)
    print("| class | module | methods (own) | methods with tbmq bases | instance attributes | tbmq bases |")
    print("|---|---|---|---|---|---|")
    for total, mine, attrs, name, path, bases in rows[:args.top]:
        print(f"| `{name}` | `{path}` | {mine} | {total} | {attrs} | {bases or '—'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
