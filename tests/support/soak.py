"""The fault suite's long mode: many random kill points and store faults, counted (`scripts/soak`).

    scripts/soak [--minutes M] [--kills N] [--seed S] [--cloud] [--quick] [--json]

Local cases, chosen at random from the seed, until N kill points landed or
M minutes passed:

  backup   SIGKILL at a random point: after k chunks, in finalize, or after
           a random delay (support.kill_points)
  restore  SIGKILL after a random number of bytes, over a fresh file or over
           an old one with --force
  prune    SIGKILL once some manifests went, or after a random delay
  forget   the same, for one backup
  store    a backup or a restore over a store failing at random
           (support.faulty_store: kind, mode, rate and keys drawn at random)
  wal-push, wal-fetch
           SIGKILL of wal-push and wal-fetch at random points; the archive
           holds each segment whole or not at all, DEST is never cut
           (support.soak_wal)
  pipes, consumer, linger
           restore --pipes to round-robin and sequential readers, SIGKILL of
           a restore into a command, a pipe held past the producer's exit
           (support.soak_pipes); a command killed at the harness's limit is
           counted as a hang

After every case the repository is audited (support.kill_points.audit):
only readable, deep-verifying backups are listed, every completed backup is
still there, leftovers are visible to `list --incomplete`. `--cloud` adds the
emulated cloud (scripts/emulated-aws): agents killed at random points and
resumed under 5% S3 faults, and (without --quick) the agent past its own
retry budget, then resumed. Prints the counts as a table (or --json);
exits 1 on any loss or hang.

`--quick` is what CI runs after the suite: a dozen kill points and a few
store-fault runs, under a minute on two cores.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for extra in (ROOT / "tests", ROOT / "tests" / "cloud"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from support import soak_pipes, soak_wal  # noqa: E402
from support.kill_points import (  # noqa: E402
    CHUNK,
    Done,
    LocalRepo,
    Tally,
    audit,
    kill_backup,
    kill_removal,
    kill_restore,
    pattern,
    unlisted_leftovers,
)

PYTHON = ROOT / ".venv" / "bin" / "python"
FAULTY = ROOT / "tests" / "support" / "faulty_store.py"
KiB, MiB = 1024, 1024**2


class LocalSoak:
    """One local repository at a time (a fresh one every `cases_per_repo` cases), and its good backups."""

    def __init__(self, workdir: Path, rng: random.Random, tally: Tally, by_case: Counter[str], cases_per_repo: int = 12) -> None:
        self.workdir, self.rng, self.tally, self.by_case = workdir, rng, tally, by_case
        self.cases_per_repo = cases_per_repo
        self.repo: LocalRepo | None = None
        self.good: dict[str, bytes] = {}
        self.wal = soak_wal.WalSoak()
        self.cases = 0
        self.repos = 0

    def current(self) -> LocalRepo:
        if self.repo is None or self.cases >= self.cases_per_repo:
            self.finish_repo()
            self.repos += 1
            self.repo = LocalRepo(self.workdir / f"repo-{self.repos}")
            self.good, self.cases, self.wal = {}, 0, soak_wal.WalSoak()
            for _ in range(2):
                data = self.data()
                self.good[self.repo.backup("db", data)] = data
        self.cases += 1
        return self.repo

    def finish_repo(self) -> None:
        if self.repo is not None:
            audit(self.repo, self.good, self.tally, f"repository {self.repos} at the end")
            soak_wal.audit_wal(self.repo, self.wal, self.tally)
            shutil.rmtree(self.repo.root, ignore_errors=True)
            self.repo = None

    def data(self) -> bytes:
        return pattern(self.rng.randint(1, 48) * CHUNK + self.rng.randint(0, CHUNK), self.rng.randrange(1 << 30))

    def check(self, repo: LocalRepo, where: str) -> None:
        listed = audit(repo, self.good, self.tally, where, restore_newest=self.rng.random() < 0.3)
        hidden = unlisted_leftovers(repo, "db", listed)
        if hidden:
            self.tally.lose(f"{where}: leftovers {hidden} are not shown by list --incomplete")

    # -- cases --------------------------------------------------------------------------------

    def backup(self) -> None:
        repo, data = self.current(), self.data()
        chunks = -(-len(data) // CHUNK)
        point = self.rng.choice([("chunks", self.rng.randint(0, max(0, chunks - 1))), ("eof", self.rng.uniform(0, 0.05)), ("delay", self.rng.uniform(0.1, 0.8))])
        kill_backup(repo, "db", data, point, self.good, self.tally)
        self.check(repo, f"after a backup killed at {point}")

    def restore(self) -> None:
        repo = self.current()
        ref = self.rng.choice(sorted(self.good))
        original = self.good[ref]
        out = repo.root / "restore-target.bin"
        previous = pattern(self.rng.randint(1, 4) * CHUNK, 7) if self.rng.random() < 0.4 else None
        out.unlink(missing_ok=True)
        if previous is not None:
            out.write_bytes(previous)
        point = self.rng.choice([("bytes", self.rng.randint(0, len(original))), ("delay", self.rng.uniform(0.05, 0.6))])
        kill_restore(repo, ref, original, out, point, self.tally, previous=previous)

    def removal(self, command: str) -> None:
        repo = self.current()
        for _ in range(self.rng.randint(1, 3)):
            data = self.data()
            self.good[repo.backup("db", data)] = data
        refs = sorted(self.good)
        if command == "prune":
            keep = self.rng.randint(1, 2)
            args = ["prune", "--keep-last", str(keep)]
            kept, doomed = refs[-keep:], refs[:-keep]
        else:
            target = self.rng.choice(refs[:-1])
            args, kept, doomed = ["forget", target], [r for r in refs if r != target], [target]
        point = self.rng.choice([("gone", self.rng.randint(1, max(1, len(doomed)))), ("delay", self.rng.uniform(0.05, 0.5))])
        for ref in doomed:
            self.good.pop(ref)  # may stay listed (the kill came first): then it must still verify
        kill_removal(repo, args, point, self.tally)
        self.check(repo, f"after a {command} killed at {point}")
        done = repo.run(*args)
        if command == "forget" and done.code == 8 and "not found" in done.error:
            return  # its manifest had gone: what is left is an incomplete backup, shown as one (checked above)
        if done.code != 0:
            self.tally.lose(f"{command} after a killed {command} failed ({done.code}): {done.error}")
        listed, _ = repo.listed()
        if set(doomed) & set(listed) or set(kept) - set(listed):
            self.tally.lose(f"after {command} completed: listed {listed}, expected {kept}")

    def race(self) -> None:
        """Forget racing a restore of the same backup, or prune racing a running backup
        (tests/test_prune_safety.py pins the orders; this tries random ones)."""
        repo = self.current()
        if self.rng.random() < 0.5 and len(self.good) > 1:
            ref = self.rng.choice(sorted(self.good)[:-1])
            original = self.good.pop(ref)
            out = repo.root / "race.bin"
            out.unlink(missing_ok=True)
            restore = repo.spawn("restore", ref, "--output", str(out), "--workers", "1")
            time.sleep(self.rng.uniform(0, 0.4))
            forgot = repo.run("forget", ref)
            _, err = restore.communicate(timeout=300)
            content = out.read_bytes() if out.exists() else None
            what = f"restore of {ref} racing its forget"
            if forgot.code != 0:
                self.tally.lose(f"{what}: forget failed ({forgot.code}): {forgot.error}")
            if (restore.returncode, content) != (0, original) and (restore.returncode not in (6, 7, 8) or content is not None):
                size = None if content is None else len(content)
                self.tally.lose(f"{what}: exit {restore.returncode} with {size} bytes at {out.name}: {err.decode(errors='replace').strip()[-300:]}")
        else:
            data = self.data()
            backup = repo.spawn("backup", "--name", "db", "--chunk-size", "64KiB", "--workers", "2", stdin=subprocess.PIPE)
            outcome: list[tuple[bytes, bytes]] = []
            feeder = threading.Thread(target=lambda: outcome.append(backup.communicate(data, timeout=300)), daemon=True)
            feeder.start()
            time.sleep(self.rng.uniform(0, 0.3))
            pruned = repo.run("prune", "--keep-last", "1")
            feeder.join(300)
            ref = outcome[0][0].decode().strip() if outcome else ""
            listed, _ = repo.listed()
            what = "a backup racing prune --keep-last 1"
            if backup.returncode != 0 or pruned.code != 0 or ref not in listed:
                self.tally.lose(f"{what}: backup exit {backup.returncode} ({ref or 'no ref'}), prune exit {pruned.code} {pruned.error}; listed {listed}")
            self.good = {r: d for r, d in self.good.items() if r in listed}  # the policy may take the older ones
            if ref:
                self.good[ref] = data
        self.tally.cases += 1
        self.check(repo, "after a race")

    def consumer_kill(self) -> None:
        """SIGKILL of `braid restore -- COMMAND` mid-stream: the consumer must die with it (support.soak_pipes)."""
        repo = self.current()
        if not self.good:
            data = self.data()
            self.good[repo.backup("db", data)] = data
        ref = self.rng.choice(sorted(self.good))
        soak_pipes.consumer_kill(repo, self.rng, self.tally, ref, len(self.good[ref]))

    def store_faults(self) -> None:
        repo = self.current()
        backing_up = self.rng.random() < 0.5
        kind = self.rng.choice(["put", "sync", "get", "head", "list", "delete"] if backing_up else ["get", "get_range", "head", "list"])
        mode = self.rng.choice(["fail", "after", "corrupt"] if kind in ("get", "get_range") else ["fail", "after"])
        match = self.rng.choices(["", "data/", "manifests/"], weights=[5, 4, 2])[0]
        rule = f"{kind}={self.rng.choice([0.05, 0.2, 0.5, 1.0])}:{mode}:{match}"
        stats = repo.root / "faults.json"
        listed_before, _ = repo.listed()
        if backing_up:
            data = self.data()
            done = self._faulty(repo, rule, stats, ["backup", "--name", "db", "--chunk-size", "64KiB", "--workers", "2"], data)
            ref = done.stdout.decode().strip()
            if done.code == 0:
                self.good[ref] = data
            what = f"backup over {rule}"
        else:
            ref = self.rng.choice(sorted(self.good))
            out = repo.root / "faulty-restore.bin"
            out.unlink(missing_ok=True)
            done = self._faulty(repo, rule, stats, ["restore", ref, "--output", str(out), "--workers", "2"], b"")
            content = out.read_bytes() if out.exists() else None
            if content not in ((self.good[ref],) if done.code == 0 else (None,)):
                self.tally.lose(f"restore of {ref} over {rule} (exit {done.code}) left {None if content is None else len(content)} bytes at {out.name}")
            what = f"restore over {rule}"
        self.tally.faults += json.loads(stats.read_text())["total"] if stats.exists() else 0
        # 3 and 4: a corrupt read of config.json (which carries no checksum) makes the repository
        # look unreadable or name another key file: refused before anything was written or read.
        if done.code not in (0, 3, 4, 6, 7) or (done.code and not done.error.startswith("braid: error: ")):
            self.tally.lose(f"{what}: exit {done.code}, {done.stderr.strip().splitlines()[-1:]}")
        listed_after, _ = repo.listed()
        unexpected = set(listed_after) - set(listed_before) - set(self.good)
        if unexpected:
            self.tally.lose(f"{what}: failed (exit {done.code}) yet published {sorted(unexpected)}")
        self.tally.cases += 1
        self.check(repo, f"after a {what}")

    def _faulty(self, repo: LocalRepo, rule: str, stats: Path, args: list[str], stdin: bytes) -> Done:
        """The real CLI over a faulty store (support.faulty_store run as a program)."""
        stats.unlink(missing_ok=True)
        command = [str(PYTHON), str(FAULTY), "--fault", rule, "--seed", str(self.rng.randrange(1 << 30)), "--stats", str(stats), "--", *args]
        proc = subprocess.run(command, input=stdin, capture_output=True, env=repo.env, timeout=300)
        return Done(proc.returncode, proc.stdout, proc.stderr.decode(errors="replace"))


def run_local(workdir: Path, rng: random.Random, tally: Tally, by_case: Counter[str], kills: int, deadline: float, store_runs: int) -> None:
    soak = LocalSoak(workdir, rng, tally, by_case)
    cases: dict[str, Callable[[], None]] = {
        "backup": soak.backup,
        "restore": soak.restore,
        "prune": lambda: soak.removal("prune"),
        "forget": lambda: soak.removal("forget"),
        "race": soak.race,
        "pipes": lambda: soak_pipes.pipes_restore(soak.current(), rng, tally),
        "consumer": soak.consumer_kill,
        "linger": lambda: soak_pipes.linger(soak.current(), rng, tally),
        "wal-push": lambda: soak_wal.wal_push_kill(soak.current(), soak.wal, rng, tally),
        "wal-fetch": lambda: soak_wal.wal_fetch_kill(soak.current(), soak.wal, rng, tally),
    }
    stores = 0
    while (tally.kills < kills or stores < store_runs) and time.monotonic() < deadline:
        if stores < store_runs and (tally.kills >= kills or rng.random() < 0.25):
            soak.store_faults()
            stores += 1
            by_case["store"] += 1
            continue
        name = rng.choices(list(cases), weights=[5, 2, 2, 2, 1, 1, 2, 0.3, 1.5, 1])[0]
        before = tally.kills
        try:
            cases[name]()
        except Exception as exc:  # a harness failure is reported as a loss, never swallowed
            tally.lose(f"{name} case raised {type(exc).__name__}: {exc}")
        by_case[name] += 1
        if tally.kills > before:
            by_case[f"{name} kills"] += tally.kills - before
    soak.finish_repo()


def run_cloud(workdir: Path, rng: random.Random, tally: Tally, by_case: Counter[str], kills: int, deadline: float, quick: bool) -> None:
    import os

    from test_cloud_faults import faults, kill_and_resume, nothing_staged, parts_of, restore_files, write_inputs
    from test_emulated_e2e import Emulator, braid

    emulator = Emulator(workdir / "emulator", "--fast-retries")
    try:
        landed = 0
        while landed < kills and time.monotonic() < deadline:
            inputs = [os.urandom(rng.randint(5 * MiB + 1, 16 * MiB)), os.urandom(rng.randint(1, 6 * MiB))]
            total = parts_of([len(d) for d in inputs])
            kind, when = rng.choice([("parts", rng.randint(1, total - 1)), ("waiting", "running"), ("waiting", "finished")])
            faults(emulator, rate=0.05, seed=rng.randrange(1 << 30), callers="all")
            number = by_case["cloud kill"]
            tmp = workdir / f"cloud-{number}"
            tmp.mkdir()
            try:
                hit = kill_and_resume(emulator, tmp, f"soak-agent-{number}", f"soak{number}", inputs, kind, when)
                landed += hit
                tally.kills += hit
            except AssertionError as exc:
                tally.lose(f"cloud agent killed at {kind} {when}: {exc}")
            tally.faults += faults(emulator)["total"]
            tally.cases += 1
            by_case["cloud kill"] += 1
            shutil.rmtree(tmp, ignore_errors=True)
        if not quick:
            # Past the agent's own retry budget: every UploadPart fails, for a minute or two.
            tmp = workdir / "cloud-budget"
            tmp.mkdir()
            inputs = [os.urandom(7 * MiB)]
            paths = write_inputs(tmp, inputs)
            faults(emulator, rate=1.0, callers="agent", ops=["UploadPart"])
            run = braid(emulator, "soak-budget", "backup", "--name", "budget", "--chunk-size", "5MiB", "--input", paths[0], timeout=900)
            tally.faults += faults(emulator)["total"]
            faults(emulator, rate=0.0)
            tally.cases += 1
            by_case["cloud past budget"] += 1
            message = run.errors[-1] if run.errors else ""
            ref = message.split("--resume ", 1)[1].split("'", 1)[0] if "--resume " in message else ""
            # One line, exit 7, the way back in (its wording depends on the last fault: SlowDown, 500 or a reset).
            if run.code != 7 or not message.startswith("braid: error: ") or not ref or emulator.keys("manifests/budget/"):
                tally.lose(f"agent past its retry budget: exit {run.code}, {message!r}, manifests {emulator.keys('manifests/budget/')}")
            else:
                resumed = braid(emulator, "soak-budget", "backup", "--resume", ref, "--input", paths[0])
                restore, restored = restore_files(emulator, "soak-budget-restore", ref, tmp, 1)
                if resumed.code != 0 or restore.code != 0 or restored != inputs:
                    tally.lose(f"resume after the retry budget: {resumed.code} {resumed.errors} / {restore.code}")
                else:
                    nothing_staged(emulator, ref)
    finally:
        emulator.stop()


def print_table(counts: dict[str, object], by_case: Counter[str]) -> None:
    rows = [("cases run", counts["cases"]), ("kill points (landed)", counts["kills"]), ("faults injected", counts["faults"]), ("losses", counts["losses"])]
    rows += [("hangs", counts["hangs"])]
    rows += [(f"  {name}", n) for name, n in sorted(by_case.items())]
    rows += [("seconds", counts["seconds"]), ("seed", counts["seed"])]
    width = max(len(name) for name, _ in rows)
    print("\n".join(f"{name:<{width}}  {value:>8}" for name, value in rows))
    for problem in counts["problems"]:  # type: ignore[attr-defined]
        print(problem if problem.startswith("HANG: ") else f"LOSS: {problem}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="soak", description="Many random kill points and store faults; exits 1 on any loss.")
    parser.add_argument("--minutes", type=float, default=10.0, help="stop after this long (default 10)")
    parser.add_argument("--kills", type=int, default=100, help="local kill points to land (default 100)")
    parser.add_argument("--store-runs", type=int, default=30, help="backups and restores over a faulty store (default 30)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock, printed)")
    parser.add_argument("--cloud", action="store_true", help="also the emulated cloud: killed agents, S3 faults, the retry budget")
    parser.add_argument("--cloud-kills", type=int, default=10, help="cloud kill points (default 10)")
    parser.add_argument("--quick", action="store_true", help="CI: 12 kill points, 6 store-fault runs (3 cloud kills), 3 minutes at most")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.kills, args.store_runs, args.cloud_kills, args.minutes = 12, 6, 3, min(args.minutes, 3.0)
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    tally, by_case = Tally(), Counter[str]()
    started = time.monotonic()
    deadline = started + args.minutes * 60
    workdir = Path(tempfile.mkdtemp(prefix="braid-soak-"))
    try:
        run_local(workdir, rng, tally, by_case, args.kills, deadline, args.store_runs)
        if args.cloud:
            run_cloud(workdir, rng, tally, by_case, args.cloud_kills, time.monotonic() + args.minutes * 60, args.quick)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    counts = {**tally.to_json(), "seconds": round(time.monotonic() - started, 1), "seed": seed}
    if args.json:
        print(json.dumps({**counts, "by_case": dict(by_case)}, indent=2))
    else:
        print_table(counts, by_case)
    if tally.kills < min(args.kills, 1):
        print(f"soak: no kill point landed in {args.minutes} minutes", file=sys.stderr)
        return 1
    return 1 if tally.losses or tally.hangs else 0


if __name__ == "__main__":
    sys.exit(main())
