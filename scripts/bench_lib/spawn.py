"""Run one command and write its wall time and rusage as JSON: `spawn.py RESULT -- ARGV...`.

Why a helper: on Linux a child's peak RSS starts at its parent's high-water
mark when it execs (the kernel records the old mm's peak), so a command
spawned straight from the harness, which holds the data set in memory,
would report the harness's size. Spawned from this small process, the
command's own peak is what wait4 reports. Standalone on purpose: it imports
nothing from the harness.
"""

import json
import os
import subprocess
import sys
import time


def main() -> int:
    result, argv = sys.argv[1], sys.argv[3:]
    started, started_at = time.perf_counter(), time.time()
    proc = subprocess.Popen(argv)  # stdin, stdout and stderr are inherited
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    with open(result, "w") as handle:
        json.dump({"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "max_rss": usage.ru_maxrss, "exit": code, "started_at": started_at}, handle)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
