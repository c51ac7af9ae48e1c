"""Stand-ins for database backup and restore tools, as real executables the CLI runs.

`dbtool` writes a deterministic stream to stdout, or to the named pipes it
is given (all at once, as Db2 does), and can fail the way real tools do:
exit non-zero at any byte with a last line on stderr, kill itself with a
signal, or wait for a signal and record that it got one. `dbrestore` reads
stdin or its pipes and checks every byte, or stops early on purpose.

Both take a spec first (`key=value,...`), then the paths, so a test can put
Braid's `{pipes}` / `{pipe1}` placeholders where the paths go.
"""

from __future__ import annotations

import os
import random
import stat
import sys
from pathlib import Path


def stream(seed: int, size: int) -> bytes:
    """The bytes `dbtool` writes for input `seed`: half random, half a repeated row."""
    rng = random.Random(seed)
    half = size // 2
    row = f"row {seed} of a table; ".encode()
    return (rng.randbytes(half) + row * ((size - half) // len(row) + 1))[:size]


_COMMON = '''
import os, random, signal, sys, threading, time

def stream(seed, size):
    rng = random.Random(seed)
    half = size // 2
    row = f"row {seed} of a table; ".encode()
    return (rng.randbytes(half) + row * ((size - half) // len(row) + 1))[:size]

spec = dict(item.split("=", 1) for item in sys.argv[1].split(",") if item)
paths = [p for arg in sys.argv[2:] for p in arg.split(", ")]
'''

DBTOOL = (
    _COMMON
    + '''
size = int(spec.get("size", "0"))
fail_at = int(spec["fail_at"]) if "fail_at" in spec else None
status = int(spec.get("status", "0"))
if "trap" in spec:
    def on_signal(signum, frame):
        with open(spec["trap"], "a") as marker:
            marker.write(signal.Signals(signum).name + "\\n")
        os._exit(128 + signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
print(f"dbtool: backing up {size} bytes to {len(paths) or 'stdout'}", file=sys.stderr, flush=True)
if fail_at == 0 and paths:
    pass  # fails before opening a single pipe
else:
    targets = [open(p, "wb") for p in paths] if paths else [os.fdopen(1, "wb")]
    cut = size if fail_at is None else fail_at
    def write(i, target):
        data = stream(i, size)
        for at in range(0, cut, 65536):
            target.write(data[at : min(cut, at + 65536)])
        target.flush()
    threads = [threading.Thread(target=write, args=(i, t)) for i, t in enumerate(targets)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    if "ready" in spec:
        open(spec["ready"], "w").close()
    if "hang" in spec:
        time.sleep(600)
    if fail_at is None:
        [t.close() for t in targets]
if paths and fail_at is None:
    print("Backup successful. The timestamp for this backup image is : 20260101000000", flush=True)  # Db2 says so on stdout
if "say" in spec:
    print(spec["say"], file=sys.stderr, flush=True)
if spec.get("kill"):
    os.kill(os.getpid(), int(spec["kill"]))
sys.exit(status)
'''
)

DBRESTORE = (
    _COMMON
    + '''
size = int(spec.get("size", "0"))
take = int(spec["take"]) if "take" in spec else None
status = int(spec.get("status", "0"))
sources = [open(p, "rb") for p in paths] if paths else [os.fdopen(0, "rb")]
got = {}
def read(i, source):
    got[i] = source.read() if take is None else source.read(take)
threads = [threading.Thread(target=read, args=(i, s)) for i, s in enumerate(sources)]
[t.start() for t in threads]
[t.join() for t in threads]
if take is None and status == 0:
    for i in range(len(sources)):
        if got[i] != stream(i, size):
            print(f"dbrestore: input {i}: {len(got[i])} bytes, not the {size} written", file=sys.stderr)
            sys.exit(9)
    print(f"dbrestore: {len(sources)} input(s) of {size} bytes each, every byte as written", file=sys.stderr)
if "say" in spec:
    print(spec["say"], file=sys.stderr, flush=True)
sys.exit(status)
'''
)


def install(directory: Path) -> tuple[Path, Path]:
    """Write `dbtool` and `dbrestore` into `directory` as executables; their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    made = []
    for name, body in (("dbtool", DBTOOL), ("dbrestore", DBRESTORE)):
        path = directory / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        made.append(path)
    return made[0], made[1]


__all__ = ["DBRESTORE", "DBTOOL", "install", "stream"]

if __name__ == "__main__":  # pragma: no cover - a manual check
    print(os.fspath(install(Path(sys.argv[1]))[0]))
