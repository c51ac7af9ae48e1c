"""The soak's WAL archive cases (issue "Point-in-time recovery", §7): `wal-push` and `wal-fetch` killed at random points.

  wal-push   SIGKILL after a random delay (or once its store began: a
             temporary file beside the archived name); then the archive
             holds the whole segment or nothing under its name, a second
             push exits 0, and wal-fetch returns exactly the pushed bytes
  wal-fetch  SIGKILL after a random delay; DEST is then absent or whole,
             never a cut file, and a second fetch returns exactly the bytes

Every segment pushed so far is fetched back at the end of a repository
(`audit_wal`). A wrong byte, a cut DEST or a push that cannot complete is a
loss; a command past the harness's limit is a hang.
"""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

from support.kill_points import BRAID, LocalRepo, Tally, _kill, _wait_for
from wal_segments import segment_bytes

NAME = "pg"
HANG = 120.0


class WalSoak:
    """The segments pushed to one repository, in order: name -> bytes."""

    def __init__(self) -> None:
        self.pushed: dict[str, bytes] = {}
        self.next_segno = 1

    def new_segment(self, rng: random.Random) -> tuple[str, bytes]:
        name = f"00000001{0:08X}{self.next_segno:08X}"
        self.next_segno += 1
        return name, segment_bytes(name, seed=rng.randrange(1 << 30))


def _fetch(repo: LocalRepo, name: str, dest: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(BRAID), "wal-fetch", "--name", NAME, "--prefetch", "0", name, str(dest)],
        capture_output=True, env=repo.env, timeout=HANG,
    )


def wal_push_kill(repo: LocalRepo, state: WalSoak, rng: random.Random, tally: Tally) -> None:
    work = repo.root / "pg_wal"
    work.mkdir(exist_ok=True)
    name, data = state.new_segment(rng)
    path = work / name
    path.write_bytes(data)
    archive = repo.path / "wal" / NAME
    proc = subprocess.Popen([str(BRAID), "wal-push", "--name", NAME, str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=repo.env)
    if rng.random() < 0.5:
        _wait_for(lambda: archive.is_dir() and any(p.name.startswith(".tmp-") for p in archive.rglob(".tmp-*")), proc, HANG)
    else:
        _wait_for(lambda: False, proc, rng.uniform(0.0, 0.4))
    killed, _, _ = _kill(proc)
    tally.cases += 1
    if killed:
        tally.kills += 1
    check = repo.root / "wal-check"
    check.unlink(missing_ok=True)
    first = _fetch(repo, name, check)
    if first.returncode == 0 and check.read_bytes() != data:
        tally.lose(f"wal-push of {name} killed: wal-fetch returned other bytes")
    elif first.returncode not in (0, 1):
        tally.lose(f"wal-push of {name} killed: wal-fetch exit {first.returncode}: {first.stderr.decode(errors='replace').strip()}")
    again = subprocess.run([str(BRAID), "wal-push", "--name", NAME, str(path)], capture_output=True, env=repo.env, timeout=HANG)
    if again.returncode != 0:
        tally.lose(f"wal-push of {name} after a killed push: exit {again.returncode}: {again.stderr.decode(errors='replace').strip()}")
        return
    state.pushed[name] = data


def wal_fetch_kill(repo: LocalRepo, state: WalSoak, rng: random.Random, tally: Tally) -> None:
    if not state.pushed:
        wal_push_kill(repo, state, random.Random(rng.random()), tally)
        if not state.pushed:
            return
    name = rng.choice(sorted(state.pushed))
    dest = repo.root / "RECOVERYXLOG"
    dest.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [str(BRAID), "wal-fetch", "--name", NAME, "--prefetch", "0", name, str(dest)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=repo.env,
    )
    _wait_for(lambda: False, proc, rng.uniform(0.0, 0.4))
    killed, _, _ = _kill(proc)
    tally.cases += 1
    if killed:
        tally.kills += 1
    if dest.exists() and dest.read_bytes() != state.pushed[name]:
        tally.lose(f"wal-fetch of {name} killed: DEST holds {dest.stat().st_size} bytes that are not the segment (a cut or wrong file)")
    dest.unlink(missing_ok=True)
    started = time.monotonic()
    again = _fetch(repo, name, dest)
    if again.returncode != 0 or dest.read_bytes() != state.pushed[name]:
        tally.lose(f"wal-fetch of {name} after a killed fetch: exit {again.returncode} after {time.monotonic() - started:.1f} s")


def audit_wal(repo: LocalRepo, state: WalSoak, tally: Tally) -> None:
    """Every segment pushed to `repo` comes back exactly."""
    dest = repo.root / "wal-audit"
    for name, data in state.pushed.items():
        dest.unlink(missing_ok=True)
        done = _fetch(repo, name, dest)
        if done.returncode != 0 or dest.read_bytes() != data:
            tally.lose(f"archived {name} did not come back whole (wal-fetch exit {done.returncode})")
