"""One process feeding, or draining, N named pipes in turn, as Db2 does.

`backup db X to /p1, ..., /pN` opens the pipes in order and moves blocks
from one pool of buffers to each pipe in turn; `restore db X from /p1, ...`
reads them likewise. Either side blocks on one pipe while the others wait,
which is what deadlocked braid when it had fewer buffers than inputs.

Run as a script (a separate process, as the database is):

    round_robin.py write BLOCK SRC=FIFO ...   open FIFOs in order, write BLOCK bytes of each SRC in turn; close all at the end
    round_robin.py read BLOCK FIFO=DST ...    open FIFOs in order, read BLOCK bytes (or to EOF) of each in turn into DST

`start_writer`/`start_reader` start it from a test.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import BinaryIO

SCRIPT = Path(__file__).resolve()


def _read_exact(pipe: BinaryIO, size: int) -> bytes:
    parts: list[bytes] = []
    got = 0
    while got < size:
        data = pipe.read(size - got)
        if not data:
            break
        parts.append(data)
        got += len(data)
    return b"".join(parts)


def write(block: int, pairs: list[tuple[str, str]]) -> None:
    sources = [open(src, "rb") for src, _ in pairs]
    pipes = [open(fifo, "wb", buffering=0) for _, fifo in pairs]  # in order: each blocks until its reader opens
    live = list(range(len(pairs)))
    while live:
        for i in list(live):
            data = sources[i].read(block)
            if not data:
                live.remove(i)
                continue
            view = memoryview(data)
            while view:
                view = view[pipes[i].write(view) or 0 :]
    for handle in [*pipes, *sources]:
        handle.close()


def read(block: int, pairs: list[tuple[str, str]]) -> None:
    pipes = [open(fifo, "rb", buffering=0) for fifo, _ in pairs]  # in order: each blocks until its writer opens
    outs = [open(dst, "wb") for _, dst in pairs]
    live = list(range(len(pairs)))
    while live:
        for i in list(live):
            data = _read_exact(pipes[i], block)
            outs[i].write(data)
            if len(data) < block:
                live.remove(i)
                pipes[i].close()
    for out in outs:
        out.close()


def _start(mode: str, block: int, pairs: list[tuple[Path, Path]]) -> subprocess.Popen[bytes]:
    args = [f"{a}={b}" for a, b in pairs]
    return subprocess.Popen([sys.executable, str(SCRIPT), mode, str(block), *args], stderr=subprocess.PIPE)


def start_writer(block: int, sources_to_fifos: list[tuple[Path, Path]]) -> subprocess.Popen[bytes]:
    return _start("write", block, sources_to_fifos)


def start_reader(block: int, fifos_to_files: list[tuple[Path, Path]]) -> subprocess.Popen[bytes]:
    return _start("read", block, fifos_to_files)


def run_beside(peer: subprocess.Popen[bytes], argv: list[str], *, timeout: float, env: dict[str, str] | None = None) -> tuple[int, bytes, str]:
    """Run `argv` (braid) while `peer` (the database's side) runs: (exit code, stdout, stderr).

    Both are killed if `argv` outlives `timeout`, and the caller is told it
    hung (AssertionError), so a deadlock fails a test rather than hanging it.
    """
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
        peer.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"{' '.join(argv[1:2])} hung (deadlock?): killed after {timeout} s; stderr: {err.decode()[-2000:]}") from None
    finally:
        stop(peer)
    return proc.returncode, out, err.decode()


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    if proc.stderr:
        proc.stderr.close()


if __name__ == "__main__":
    mode, size = sys.argv[1], int(sys.argv[2])
    given = [tuple(arg.split("=", 1)) for arg in sys.argv[3:]]
    (write if mode == "write" else read)(size, [(a, b) for a, b in given])
