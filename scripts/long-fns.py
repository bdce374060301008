#!/usr/bin/env python3
"""List the Rust functions longer than a limit in the workspace's production code.

A function's length runs from its `fn` line to its closing brace. Left out:
tests/ folders, fuzz/, files named tests.rs and every `#[cfg(test)]` module
(the rest of the file after `#[cfg(test)] mod ... {` up to its closing brace).
It counts braces outside strings, chars and comments: a heuristic, not a
parser, but close enough for rustfmt-formatted code.

Usage: scripts/long-fns.py [--limit 70] [--summary] [ROOT]
"""
import argparse
import os
import re
import sys
from collections import Counter

CRATES = ["wal", "engine", "cluster", "server", "client", "loadgen", "sim", "tests"]
FN_RE = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)")


def strip_code(line, state):
    """Returns the line without strings, chars and comments; `state` carries
    an open block comment or string across lines."""
    out = []
    i = 0
    n = len(line)
    while i < n:
        if state["block"]:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out)
            state["block"] = False
            i = end + 2
            continue
        if state["string"]:
            c = line[i]
            if c == "\\":
                i += 2
                continue
            if c == '"':
                state["string"] = False
            i += 1
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"] = True
            i += 2
            continue
        raw = re.match(r'r(#*)"', line[i:])
        if raw and (i == 0 or not (line[i - 1].isalnum() or line[i - 1] == "_")):
            close = '"' + raw.group(1)
            end = line.find(close, i + len(raw.group(0)))
            i = n if end < 0 else end + len(close)
            continue
        if c == '"':
            state["string"] = True
            i += 1
            continue
        if c == "'":
            # A char literal ('x', '\n', '{'), not a lifetime ('a).
            m = re.match(r"'(\\.[^']*|[^'\\])'", line[i:])
            if m:
                i += len(m.group(0))
                continue
        out.append(c)
        i += 1
    return "".join(out)


def long_functions(path, limit):
    """Yields (name, first line, length) for each function in `path` over `limit` lines."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    state = {"block": False, "string": False}
    depth = 0
    open_fns = []  # (name, start line, depth before its body)
    skip_until_depth = None
    pending_cfg_test = False
    pending_fn = None
    for number, raw in enumerate(lines, start=1):
        code = strip_code(raw, state)
        stripped = code.strip()
        if skip_until_depth is None:
            if stripped.startswith("#[cfg(test)]"):
                pending_cfg_test = True
            elif pending_cfg_test and re.match(r"(pub\s+)?mod\s+\w+\s*\{", stripped):
                skip_until_depth = depth
                pending_cfg_test = False
            elif stripped and not stripped.startswith("#["):
                pending_cfg_test = False
            m = FN_RE.match(code)
            if m:
                pending_fn = (m.group(7), number)
        for c in code:
            if c == "{":
                if pending_fn is not None and skip_until_depth is None:
                    open_fns.append((pending_fn[0], pending_fn[1], depth))
                    pending_fn = None
                depth += 1
            elif c == "}":
                depth -= 1
                if open_fns and open_fns[-1][2] == depth:
                    name, start, _ = open_fns.pop()
                    length = number - start + 1
                    if length > limit:
                        yield name, start, length
                if skip_until_depth is not None and depth == skip_until_depth:
                    skip_until_depth = None
            elif c == ";" and pending_fn is not None:
                pending_fn = None  # a declaration without a body (trait item)


def production_files(root):
    for crate in CRATES:
        base = os.path.join(root, crate)
        for folder, dirs, files in os.walk(base):
            dirs[:] = [d for d in dirs if d not in ("tests", "target", "benches")]
            for name in files:
                if name.endswith(".rs") and name != "tests.rs":
                    yield os.path.join(folder, name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--limit", type=int, default=70)
    parser.add_argument("--summary", action="store_true", help="only the count per crate")
    args = parser.parse_args()
    root = os.path.normpath(args.root)
    per_crate = Counter()
    rows = []
    for path in sorted(production_files(root)):
        rel = os.path.relpath(path, root)
        for name, start, length in long_functions(path, args.limit):
            per_crate[rel.split(os.sep)[0]] += 1
            rows.append(f"{length:4} {rel}:{start} {name}")
    if not args.summary:
        print("\n".join(sorted(rows, reverse=True)))
    for crate in CRATES:
        print(f"{crate}: {per_crate[crate]}")
    print(f"total: {sum(per_crate.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
