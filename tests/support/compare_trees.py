"""Compare two directory trees byte for byte: python3 compare_trees.py A B [--allow NAME ...].

Prints every path that is only in one tree, or whose type, link target or bytes differ, except the
paths given with --allow (relative, e.g. backup_manifest), and how many files were equal. Exit 0 if
nothing else differs, 1 otherwise. scripts/e2e-incremental uses it on the two rebuilds of a chain.
"""

from __future__ import annotations

import filecmp
import os
import sys


def listing(root: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for current, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(current, name)
            relative = os.path.relpath(path, root)
            found[relative] = "link:" + os.readlink(path) if os.path.islink(path) else "dir" if os.path.isdir(path) else "file"
    return found


def main(argv: list[str]) -> int:
    first, second, *rest = argv
    allowed = {rest[i + 1] for i, arg in enumerate(rest) if arg == "--allow"}
    a, b = listing(first), listing(second)
    differ, equal = [], 0
    for relative in sorted(set(a) | set(b)):
        if relative in allowed:
            continue
        if relative not in a or relative not in b:
            differ.append(f"only in {first if relative in a else second}: {relative}")
        elif a[relative] != b[relative]:
            differ.append(f"{relative}: {a[relative]} against {b[relative]}")
        elif a[relative] == "file":
            if filecmp.cmp(os.path.join(first, relative), os.path.join(second, relative), shallow=False):
                equal += 1
            else:
                differ.append(f"{relative}: the bytes differ")
    for line in differ:
        print(line)
    print(f"{equal} files equal byte for byte; {len(differ)} differences; allowed to differ: {', '.join(sorted(allowed)) or 'nothing'}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
