#!/usr/bin/env python3
"""The `duplicates` pairs with neither side in test code (tests/, */tests/,
fuzz/, sim/): the count issue 21 tracks. Runs `duplicates` over the whole
tree (about two minutes) and prints the count, then the rows.

    python3 scripts/duplicates-outside-tests.py [--quiet]
"""
import re
import subprocess
import sys


def testy(path: str) -> bool:
    return path.startswith(("tests/", "fuzz/", "sim/")) or "/tests/" in path


def main() -> None:
    out = subprocess.run(
        ["duplicates", "--seconds", "300", "--most", "200"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"D\d+ (\S+):\S+ ~ (\S+):\S+", line)
        if m and not testy(m.group(1)) and not testy(m.group(2)):
            rows.append(line)
    print(f"{len(rows)} pairs outside tests ({out.splitlines()[0] if out else 'no output'})")
    for line in out.splitlines():
        if line.startswith(("incomplete:", "(+")):
            print(line)
    if "--quiet" not in sys.argv:
        print("\n".join(rows))


if __name__ == "__main__":
    main()
