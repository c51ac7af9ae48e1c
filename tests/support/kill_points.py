"""Kill points: SIGKILL a `braid` command at a chosen moment, then check what must still hold.

Shared by tests/test_faults.py (a handful of fixed kill points) and
scripts/soak (many random ones), so both check exactly the same things.

A kill point says when the process dies:

  ("chunks", k)    a backup, once k of its chunks are stored (mid-stream)
  ("eof", s)       a backup, s seconds after its input ended (finalize)
  ("bytes", n)     a restore, once n bytes of its output are on disk
  ("gone", k)      a prune or forget, once k manifests have gone
  ("rekeyed", k)   a rekey, once k manifests name the new key
  ("delay", s)     any command, s seconds after it started

A kill that lands after the command finished is not a kill point (the
command's outcome is checked like any other run); `Tally.kills` counts
only processes that died of the SIGKILL.

After every case, `audit` checks the repository the way a user would see it:
`list` shows only readable backups, `verify --all --deep` passes (so no
listed backup is incomplete), every backup that completed and was not
removed on purpose is still listed (never lose a good one), and the newest
one restores byte for byte; `unlisted_leftovers` finds data of unpublished
backups that `list --incomplete` fails to show. Each broken rule is a loss.
A killed restore is checked on the spot (`kill_restore`): its output's real
name holds the old file, nothing, or the whole backup, and the next restore
completes over whatever the kill left.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BRAID = ROOT / ".venv" / "bin" / "braid"
CHUNK = 64 * 1024
PARTIAL_SUFFIX = ".braid-partial"


@dataclass
class Tally:
    """What a fault run did and found: the closing note's counts."""

    cases: int = 0
    kills: int = 0  # kill points that landed: the process died of SIGKILL
    faults: int = 0  # faults injected (store faults, S3 faults)
    losses: int = 0
    hangs: int = 0  # a command that had to be killed after the harness's limit
    problems: list[str] = field(default_factory=list)

    def lose(self, problem: str) -> None:
        self.losses += 1
        self.problems.append(problem)

    def hang(self, problem: str) -> None:
        self.hangs += 1
        self.problems.append(f"HANG: {problem}")

    def add(self, other: Tally) -> None:
        self.cases += other.cases
        self.kills += other.kills
        self.faults += other.faults
        self.losses += other.losses
        self.hangs += other.hangs
        self.problems += other.problems

    def to_json(self) -> dict[str, Any]:
        return {"cases": self.cases, "kills": self.kills, "faults": self.faults, "losses": self.losses, "hangs": self.hangs, "problems": self.problems}


@dataclass
class Done:
    code: int
    stdout: bytes
    stderr: str

    @property
    def error(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.startswith("braid: ")]
        return lines[-1] if lines else ""


def pattern(size: int, seed: int) -> bytes:
    """Compressible yet distinct per seed: a database dump's mix of rows and noise."""
    import random

    rng = random.Random(seed)
    row = f"row {seed:06d} of a table, with some text; ".encode()
    noise = rng.randbytes(size // 4)
    return (noise + row * (size // len(row) + 1))[:size]


class LocalRepo:
    """A local repository with its own key directory; `braid` runs as a separate process."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.path = root / "repo"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("BRAID_", "AWS_"))}
        self.env.update(XDG_CONFIG_HOME=str(root / "config"), BRAID_REPO=str(self.path))
        done = self.run("init")
        if done.code != 0:
            raise RuntimeError(f"braid init failed: {done.stderr}")

    def run(self, *args: str, stdin: bytes = b"", timeout: float = 120) -> Done:
        proc = subprocess.run([str(BRAID), *args], input=stdin, capture_output=True, env=self.env, timeout=timeout)
        return Done(proc.returncode, proc.stdout, proc.stderr.decode(errors="replace"))

    def check(self, *args: str) -> Done:
        """A read-only command (list, verify, restore to a file) in this process: the checks'
        own commands need not pay a process start each, only the commands under test do."""
        from braid.cli.main import main

        saved = {name: os.environ.get(name) for name in ("XDG_CONFIG_HOME", "BRAID_REPO", "BRAID_KEY_FILE")}
        os.environ.update(XDG_CONFIG_HOME=self.env["XDG_CONFIG_HOME"], BRAID_REPO=self.env["BRAID_REPO"])
        os.environ.pop("BRAID_KEY_FILE", None)
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(list(args))
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        return Done(code, out.getvalue().encode(), err.getvalue())

    def spawn(self, *args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
        return subprocess.Popen([str(BRAID), *args], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env)

    # -- what is on disk ---------------------------------------------------------------

    def chunk_files(self, name: str) -> int:
        """Chunks stored under data/NAME/ (every backup of the name), temporary files not counted."""
        return sum(1 for path in self._data_files(name) if path.name.isdigit())

    def _data_files(self, name: str) -> Iterator[Path]:
        base = self.path / "data" / name
        if base.is_dir():
            for directory in base.iterdir():
                if directory.is_dir():
                    yield from (p for p in directory.iterdir() if p.is_file())

    def manifests(self) -> int:
        base = self.path / "manifests"
        return sum(1 for p in base.rglob("*.json")) if base.is_dir() else 0

    def backup(self, name: str, data: bytes) -> str:
        done = self.run("backup", "--name", name, "--chunk-size", "64KiB", "--workers", "2", stdin=data)
        if done.code != 0:
            raise RuntimeError(f"backup of {name} failed ({done.code}): {done.stderr}")
        return done.stdout.decode().strip()

    def listed(self) -> tuple[list[str], list[str]]:
        """(backups `list` shows, rows it could not read)."""
        done = self.check("list", "--json")
        if done.code != 0:
            return [], [f"braid list failed ({done.code}): {done.error}"]
        rows = json.loads(done.stdout or b"[]")
        return [r["backup"] for r in rows if "error" not in r], [f"{r['backup']}: {r['error']}" for r in rows if "error" in r]

    def incomplete(self) -> list[str]:
        done = self.check("list", "--incomplete", "--json")
        if done.code != 0:
            raise RuntimeError(f"braid list --incomplete failed ({done.code}): {done.stderr}")
        return [row["backup"] for row in json.loads(done.stdout or b"[]")]


def audit(repo: LocalRepo, good: dict[str, bytes], tally: Tally, where: str, restore_newest: bool = True) -> list[str]:
    """Every rule a user relies on after a crash; each broken one is a loss. Returns what `list` shows."""
    listed, unreadable = repo.listed()
    for row in unreadable:
        tally.lose(f"{where}: list shows an unreadable backup: {row}")
    if listed:
        verified = repo.check("verify", "--all", "--deep", "--json")
        if verified.code != 0:
            tally.lose(f"{where}: a listed backup fails verify --deep ({verified.code}): {verified.error}")
    for ref in good:
        if ref not in listed:
            tally.lose(f"{where}: completed backup {ref} is no longer listed")
    if restore_newest and good:
        ref = max(good, key=lambda r: r.partition("@")[2])
        out = repo.root / "audit-restore.bin"
        done = repo.check("restore", ref, "--output", str(out), "--force")
        if done.code != 0 or out.read_bytes() != good[ref]:
            tally.lose(f"{where}: {ref} does not restore identically ({done.code}: {done.error})")
        out.unlink(missing_ok=True)
    return listed


def unlisted_leftovers(repo: LocalRepo, name: str, listed: list[str]) -> list[str]:
    """Backups of `name` with data but no manifest that `list --incomplete` does not show (should be none)."""
    base = repo.path / "data" / name
    with_data = {f"{name}@{d.name}" for d in base.iterdir() if d.is_dir() and any(d.iterdir())} if base.is_dir() else set()
    return sorted(with_data - set(listed) - set(repo.incomplete()))


# -- killing -------------------------------------------------------------------------------


def _wait_for(condition: Callable[[], bool], proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Poll `condition` until true, the process ends, or `timeout`; True if it became true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.0005)
    return False


def _kill(proc: subprocess.Popen[bytes]) -> tuple[bool, bytes, str]:
    """SIGKILL unless already ended; (killed, stdout, stderr)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.stdin = None  # a feeder thread owns it (and closes it)
    out, err = proc.communicate(timeout=60)
    return proc.returncode == -signal.SIGKILL, out, err.decode(errors="replace")


class _Feeder(threading.Thread):
    """The producer: writes `data` to the backup's stdin, pausing after `pause_at` bytes until released."""

    def __init__(self, proc: subprocess.Popen[bytes], data: bytes, pause_at: int | None) -> None:
        super().__init__(daemon=True)
        self.proc, self.data, self.pause_at = proc, data, pause_at
        self.release = threading.Event()
        self.ended = threading.Event()  # all written and stdin closed
        self.start()

    def run(self) -> None:
        pipe = self.proc.stdin
        assert pipe is not None
        try:
            cut = len(self.data) if self.pause_at is None else self.pause_at
            pipe.write(self.data[:cut])
            pipe.flush()
            if cut < len(self.data):
                self.release.wait(60)
                if self.proc.poll() is not None:
                    return
                pipe.write(self.data[cut:])
            pipe.close()
            self.ended.set()
        except (BrokenPipeError, ValueError, OSError):
            pass  # killed: the producer stops, as a database tool does

    def finish(self) -> None:
        self.release.set()
        self.join(30)


def kill_backup(repo: LocalRepo, name: str, data: bytes, point: tuple[str, float], good: dict[str, bytes], tally: Tally) -> bool:
    """A backup of `data` on stdin, killed at `point`; returns whether the kill landed."""
    kind, value = point
    before = repo.chunk_files(name)
    listed_before = set(repo.listed()[0])
    proc = repo.spawn("backup", "--name", name, "--chunk-size", "64KiB", "--workers", "2", stdin=subprocess.PIPE)
    if kind == "chunks":
        k = int(value)
        feeder = _Feeder(proc, data, pause_at=min(len(data), (k + 1) * CHUNK))
        _wait_for(lambda: repo.chunk_files(name) - before >= k, proc, timeout=20)
    else:
        feeder = _Feeder(proc, data, pause_at=None)
        if kind == "eof":
            if feeder.ended.wait(30):
                time.sleep(value)
        else:
            time.sleep(value)
    killed, out, err = _kill(proc)
    feeder.finish()
    tally.cases += 1
    ref = out.decode().strip()
    if killed:
        tally.kills += 1
    elif proc.returncode != 0:
        tally.lose(f"backup {name} at {point}: failed without a kill ({proc.returncode}): {err.strip().splitlines()[-1:]}")
    if ref:  # printed only once published: a good backup, killed or not
        good[ref] = data
    elif killed:
        # Killed after publishing but before printing NAME@ID: the backup is
        # complete and listed (the audit deep-verifies and may restore it).
        for published in set(repo.listed()[0]) - listed_before:
            good[published] = data
    return killed


def kill_restore(repo: LocalRepo, ref: str, original: bytes, out: Path, point: tuple[str, float], tally: Tally, previous: bytes | None = None) -> bool:
    """A restore to the file `out` killed at `point`; `out` must then hold `previous` (or nothing) or all of `original`."""
    kind, value = point
    args = ["restore", ref, "--output", str(out), "--workers", "1"] + (["--force"] if previous is not None else [])
    proc = repo.spawn(*args)
    partial = Path(str(out) + PARTIAL_SUFFIX)

    def written() -> int:
        for path in (partial, out):
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if path == partial or previous is None:
                return size
        return 0

    if kind == "bytes":
        _wait_for(lambda: written() >= value, proc, timeout=20)
    else:
        time.sleep(value)
    killed, _out, err = _kill(proc)
    tally.cases += 1
    tally.kills += killed
    if not killed and proc.returncode != 0:
        tally.lose(f"restore of {ref} at {point}: failed without a kill ({proc.returncode}): {err.strip()}")
    content = out.read_bytes() if out.exists() else None
    allowed = [original] + ([previous] if previous is not None else [None])
    if content not in allowed:
        size = "missing" if content is None else f"{len(content)} bytes"
        tally.lose(f"restore of {ref} killed at {point}: {out.name} is neither the old file nor the whole backup ({size})")
    # The next restore completes over whatever the kill left (a partial file included).
    again = repo.check("restore", ref, "--output", str(out), "--force")
    if again.code != 0 or out.read_bytes() != original:
        tally.lose(f"restore of {ref} after a kill at {point} did not complete identically ({again.code}): {again.error}")
    if partial.exists():
        tally.lose(f"a completed restore left {partial.name} behind")
    return killed


def _kill_at(repo: LocalRepo, args: list[str], point: tuple[str, float], reached: Callable[[], bool] | None, timeout: float, tally: Tally) -> bool:
    """Run `braid ARGS`, SIGKILL it once `reached()` holds (or after `point`'s delay when None), count it."""
    proc = repo.spawn(*args)
    if reached is not None:
        _wait_for(reached, proc, timeout=timeout)
    else:
        time.sleep(point[1])
    killed, _out, err = _kill(proc)
    tally.cases += 1
    tally.kills += killed
    if not killed and proc.returncode != 0:
        tally.lose(f"{args[0]} at {point}: failed without a kill ({proc.returncode}): {err.strip()}")
    return killed


def kill_removal(repo: LocalRepo, args: list[str], point: tuple[str, float], tally: Tally) -> bool:
    """`braid prune ...` or `braid forget ...` killed at `point`; the caller audits."""
    kind, value = point
    manifests = repo.manifests()
    reached = (lambda: repo.manifests() <= manifests - value) if kind == "gone" else None
    return _kill_at(repo, args, point, reached, 20, tally)


def manifests_naming(repo: LocalRepo, key_id: str) -> int:
    """Manifests whose wrapped key names `key_id` (a rekey's progress, read off the disk)."""
    base = repo.path / "manifests"
    needle = f'"key_id":"{key_id}"'.encode()
    return sum(1 for p in base.rglob("*.json") if needle in p.read_bytes()) if base.is_dir() else 0


def kill_rekey(repo: LocalRepo, args: list[str], point: tuple[str, float], new_key_id: str, tally: Tally) -> bool:
    """`braid rekey ...` killed at `point` (("rekeyed", k) or ("delay", s)); the caller audits."""
    kind, value = point
    reached = (lambda: manifests_naming(repo, new_key_id) >= value) if kind == "rekeyed" else None
    return _kill_at(repo, args, point, reached, 60, tally)
