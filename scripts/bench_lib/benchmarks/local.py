"""local: `braid backup`/`braid restore` end to end vs a zstd | openssl pipeline.

Backup, ours: `braid backup --repo DIR --name bench < FILE` into a fresh local
repository per repetition (the CLI exactly as a user runs it: progress goes to
a log file, as when stderr is not a TTY). Reference: `zstd -T<cores> -3 -c
FILE | openssl enc -aes-256-ctr -K HEX -iv HEX > OUT`.

Restore, ours: `braid restore --repo DIR bench@latest > /dev/null`. Reference:
`openssl enc -d -aes-256-ctr -K HEX -iv HEX -in OUT | zstd -d -c > /dev/null` (inputs evicted from the page cache first; bytes compared once, untimed).

Both sides read the same cached file (warmed before each run: braid drops
its input's pages as it reads) and write into the same work directory;
written data is flushed (sync) after every run, outside the timing, so one
run's writeback does not bill the next. The local store fsyncs every chunk
inside braid's run, so a second backup row compares with the pipeline plus
the sync of its output (no target: informational). Restored bytes are compared with the
original once per side. Stored size: repository bytes (chunks + manifest)
vs the pipeline's output.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import time
from pathlib import Path

from bench_lib.context import Context, add_engine_options, add_option_once
from bench_lib.report import Comparison, Section
from bench_lib.timing import Sample, Series, drop_dirty_pages, run_command, warm_page_cache
from braid.cli.sizes import DEFAULT_CHUNK_DIRECTORY

NAME = "local"
HELP = "braid backup/restore (local repository) vs zstd -T<cores> | openssl enc -aes-256-ctr and back"
ORDER = 20
IN_ALL = True
TARGET = 0.90
COPY_TARGET = 2.0  # backup time / copy time: the copy takes <= 0.5x the backup's time


def add_arguments(parser) -> None:
    add_engine_options(parser)
    add_option_once(parser, "--workers", type=int, default=None, help="local: braid --workers and zstd -T (default: cores)")
    add_option_once(parser, "--keep", action="store_true", help="local: keep the repositories and outputs in the work directory")


def _tree_bytes(path: Path) -> tuple[int, int]:
    total = files = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            total += os.path.getsize(os.path.join(dirpath, name))
            files += 1
    return total, files


def _check_cli(ctx: Context) -> str | None:
    if not ctx.braid.exists():
        return f"{ctx.braid} does not exist (run the set-up from README.md)"
    probe = subprocess.run([str(ctx.braid), "backup", "--help"], capture_output=True, text=True, env=ctx.env())
    if probe.returncode != 0:
        return f"`braid backup --help` failed: {(probe.stderr or probe.stdout).strip().splitlines()[-1:]}"
    return None


def run(ctx: Context) -> Section:
    args = ctx.args
    workers = args.workers or ctx.cores
    # braid's default for a directory repository unless --chunk-size was typed: what a user gets.
    chunk_size = args.chunk_size if getattr(args, "chunk_size_given", False) else DEFAULT_CHUNK_DIRECTORY
    section = Section(NAME, f"local backup and restore end to end, {workers} workers, {chunk_size // 2**20} MiB chunks, zstd level {args.level}")
    problem = _check_cli(ctx)
    if problem:
        section.skipped = problem
        return section
    for tool in ("zstd", "openssl"):
        if not shutil.which(tool):
            section.skipped = f"{tool} is not on PATH"
            return section

    data = ctx.dataset()
    chunks = -(-data.size // chunk_size)
    if chunks < 4 * workers:
        section.notes.append(
            f"only {chunks} chunk(s) for {workers} workers: braid cannot overlap reading, encoding and writing much,"
            " and start-up weighs more; use --size of at least 4 x workers x chunk size for meaningful ratios"
        )
    work = ctx.scratch("local")
    braid, env = str(ctx.braid), ctx.env()
    aes_key, aes_iv = os.urandom(32).hex(), os.urandom(16).hex()
    ref_out = work / "pipeline.zst.aes"
    ref_restored = work / "pipeline-restored.bin"
    ours_restored = work / "braid-restored.bin"
    backup_log, restore_log, backup_id_file = work / "backup.log", work / "restore.log", work / "backup.id"
    copy_log = work / "copy.log"  # a file of its own: `timed` removes the file it is given for stderr before the run

    ref_backup_cmd = (
        f"set -o pipefail; zstd -T{workers} -{args.level} -q -c '{data.path}'"
        f" | openssl enc -aes-256-ctr -K {aes_key} -iv {aes_iv}"
    )
    ref_restore_cmd = f"set -o pipefail; openssl enc -d -aes-256-ctr -K {aes_key} -iv {aes_iv} -in '{ref_out}' | zstd -d -q -c"

    backup_ours, backup_ref, restore_ours, restore_ref = Series(), Series(), Series(), Series()
    backup_ref_synced = Series()
    copy_ours = Series()  # braid copy of the backup into a second local repository, against the backup itself
    stored: dict[str, int] = {}

    def fresh_repo(rep: int) -> tuple[Path, Path]:
        repo, key = work / f"repo{rep}", work / f"repo{rep}.key"
        shutil.rmtree(repo, ignore_errors=True)
        key.unlink(missing_ok=True)
        subprocess.run([braid, "init", "--repo", str(repo), "--key-file", str(key)], check=True, capture_output=True, env=env)
        return repo, key

    def timed(series: Series, argv: list[str], durable: Series | None = None, **io) -> None:
        if io.get("stderr") is not None:
            io["stderr"].unlink(missing_ok=True)
        sample = series.add(run_command(argv, env=env, **io))
        started = time.perf_counter()
        drop_dirty_pages()
        if durable is not None:  # the run plus flushing what it wrote: braid fsyncs every chunk itself
            durable.add(Sample(sample.wall + time.perf_counter() - started, sample.cpu, sample.max_rss))

    previous: Path | None = None
    for rep in range(ctx.reps):
        repo, key = fresh_repo(rep)
        common = ["--repo", str(repo), "--key-file", str(key)]
        backup_argv = [braid, "backup", *common, "--name", "bench", "--chunk-size", str(chunk_size), "--level", str(args.level), "--workers", str(workers)]
        restore_argv = [braid, "restore", *common, "--workers", str(workers), "bench@latest"]
        backups = [
            lambda backup_argv=backup_argv: (warm_page_cache(data.path), timed(backup_ours, backup_argv, stdin=data.path, stdout=backup_id_file, stderr=backup_log)),
            lambda: (warm_page_cache(data.path), timed(backup_ref, ["bash", "-c", ref_backup_cmd], backup_ref_synced, stdout=ref_out)),
        ]
        # Restores read cold: backups are read back long after they were
        # written, and braid's store already drops written chunks from the
        # page cache (it is the database's), so the reference's input is
        # evicted too before its run, or it would be the only side reading RAM.
        # Both sides write to /dev/null: writing 512 MiB of fresh page cache
        # costs this machine's kernel seconds of reclaim, billed to whichever
        # side runs when the cache is full (measured 0.5-4.5 s either way),
        # which swamped the comparison. The bytes are still checked: rep 0
        # restores both sides to files, untimed, and compares them.
        restores = [
            lambda repo=repo, restore_argv=restore_argv: (_evict(repo), timed(restore_ours, restore_argv, stdout=Path(os.devnull), stderr=restore_log)),
            lambda: (_evict(ref_out), timed(restore_ref, ["bash", "-c", ref_restore_cmd], stdout=Path(os.devnull))),
        ]
        if rep % 2:
            backups.reverse()
            restores.reverse()
        ctx.log(f"local: repetition {rep + 1}/{ctx.reps}: backup ...")
        for side in backups:
            side()
        ctx.log(f"local: repetition {rep + 1}/{ctx.reps}: restore ...")
        for side in restores:
            side()
        ctx.log(f"local: repetition {rep + 1}/{ctx.reps}: copy ...")
        target, target_key = fresh_repo(rep + 1000)
        _evict(repo)
        timed(copy_ours, [braid, "copy", *common, "bench@latest", "--to", str(target), "--to-key-file", str(target_key)], stderr=copy_log)
        shutil.rmtree(target, ignore_errors=True)
        target_key.unlink(missing_ok=True)
        if rep == 0:
            run_command(restore_argv, env=env, stdout=ours_restored, stderr=restore_log)
            run_command(["bash", "-c", ref_restore_cmd], env=env, stdout=ref_restored)
            for label, path in (("braid restore", ours_restored), ("reference pipeline", ref_restored)):
                if not filecmp.cmp(path, data.path, shallow=False):
                    raise RuntimeError(f"{label} did not give back the original bytes ({path})")
            stored["repo"], stored["files"] = _tree_bytes(repo)
            stored["pipeline"] = ref_out.stat().st_size
            stored["backup_id"] = backup_id_file.read_text().strip()  # type: ignore[assignment]
        ours_restored.unlink(missing_ok=True)
        ref_restored.unlink(missing_ok=True)
        if previous is not None and not args.keep:
            shutil.rmtree(previous, ignore_errors=True)
            previous.with_suffix(".key").unlink(missing_ok=True)
        previous = repo

    cores = f"-T{workers}"
    section.comparisons = [
        Comparison(
            "backup",
            f"braid backup --workers {workers} < FILE",
            f"zstd {cores} -{args.level} -c FILE | openssl enc -aes-256-ctr > OUT",
            data.size,
            backup_ours,
            backup_ref,
            TARGET,
        ),
        Comparison(
            "backup vs pipeline+sync",
            f"braid backup --workers {workers} < FILE (fsyncs each chunk)",
            "the same pipeline, then sync (durable like braid's store)",
            data.size,
            backup_ours,
            backup_ref_synced,
        ),
        Comparison(
            "restore",
            f"braid restore --workers {workers} bench@latest > /dev/null",
            "openssl enc -d -aes-256-ctr -in OUT | zstd -d -c > /dev/null",
            data.size,
            restore_ours,
            restore_ref,
            TARGET,
        ),
    ]
    # Issue 25's figure: a copy between two local repositories takes at most half a backup of the same data.
    section.comparisons.append(Comparison(
        "copy vs backup",
        "braid copy bench@latest --to REPO2 (chunks as stored, key re-wrapped)",
        f"braid backup --workers {workers} < FILE (the same data)",
        data.size,
        copy_ours,
        backup_ours,
        COPY_TARGET,
    ))
    section.facts = {
        "repository bytes (chunks + manifest)": stored["repo"],
        "repository files": stored["files"],
        "pipeline output bytes": stored["pipeline"],
        "stored size ratio (repository / pipeline)": round(stored["repo"] / stored["pipeline"], 4),
        "compression ratio braid (plaintext / repository)": round(data.size / stored["repo"], 3),
        "compression ratio pipeline (plaintext / output)": round(data.size / stored["pipeline"], 3),
        "braid backup peak RSS (MiB)": round(backup_ours.max_rss / 1024, 1),
        "braid restore peak RSS (MiB)": round(restore_ours.max_rss / 1024, 1),
        "backup CPU-s/GiB ours vs pipeline": f"{backup_ours.best_cpu * 2**30 / data.size:.2f} vs {backup_ref.best_cpu * 2**30 / data.size:.2f}",
        "restore CPU-s/GiB ours vs pipeline": f"{restore_ours.best_cpu * 2**30 / data.size:.2f} vs {restore_ref.best_cpu * 2**30 / data.size:.2f}",
    }
    if not args.keep and previous is not None:
        shutil.rmtree(previous, ignore_errors=True)
        previous.with_suffix(".key").unlink(missing_ok=True)
        ref_out.unlink(missing_ok=True)
    return section


def _evict(path: Path) -> None:
    """Drop a file's (or a tree's files') pages from the page cache."""
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    os.sync()
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
