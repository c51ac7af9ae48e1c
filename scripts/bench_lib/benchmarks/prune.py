"""prune: planning retention from the catalog (the scheduled prune) against reading every manifest (a host's prune).

The repository is the catalog benchmark's (bench_lib.benchmarks.catalog:
--backups synthetic 1 TiB backups over --names names, one an hour back from
two days ago, each with a real sealed manifest, summary and log marker),
on a local directory or moto's S3 server (--targets). For each, with the
policy keep_daily 7 / keep_weekly 4 / keep_monthly 6:

- catch-up: the first run after a policy was configured, when most
  backups go (both planners must read the manifests they remove);
- steady state: after that prune, one new backup per name, as the next
  day's run finds it: the catalog planner reads only the kept and the
  removed, the host's every manifest.

Counted through the store: manifest GETs, LIST calls and the objects they
returned (the host's leftover search lists every chunk), prefix LISTs (the
catalog planner's leftover search). Seconds are `plan_prune` in-process.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench_lib import s3proxy
from bench_lib.benchmarks.catalog import BUCKET, _populate
from bench_lib.context import Context, add_option_once
from bench_lib.report import Section, Table

NAME = "prune"
HELP = "retention planned from the catalog vs from every manifest, at --backups synthetic backups (local and moto S3)"
ORDER = 55
IN_ALL = False
RULES = {"keep_daily": 7, "keep_weekly": 4, "keep_monthly": 6}


def add_arguments(parser) -> None:
    add_option_once(parser, "--backups", type=int, default=10_000, help="prune: backups in the repository (default 10,000)")
    add_option_once(parser, "--names", type=int, default=10, help="prune: backup names they are spread over (default 10)")
    add_option_once(parser, "--recent", type=int, default=24, help="prune: of them, published in the last hour (default 24)")
    add_option_once(parser, "--chunks-per-backup", type=int, default=64, help="prune: chunk entries (and chunk objects) per backup (default 64)")
    add_option_once(parser, "--targets", default="local,s3", help="prune: comma-separated, of local and s3 (default both)")


class Counting:
    """The store, counting what planning asks of it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reset()

    def reset(self) -> None:
        self.manifest_gets = 0
        self.lists = 0
        self.listed_objects = 0
        self.prefix_lists = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get(self, key: str) -> bytes:
        if key.startswith("manifests/"):
            self.manifest_gets += 1
        data: bytes = self.inner.get(key)
        return data

    def list(self, prefix: str) -> Iterator[Any]:
        self.lists += 1
        for info in self.inner.list(prefix):
            self.listed_objects += 1
            yield info

    def list_prefixes(self, prefix: str) -> Iterator[str]:
        self.prefix_lists += 1
        yield from self.inner.list_prefixes(prefix)

    def delete(self, keys: Iterable[str]) -> None:
        self.inner.delete(keys)


def _chunks(store: Any, refs: list[Any], per_backup: int) -> None:
    """Chunk objects under data/NAME/ID/ (small: their number is what a listing pays for)."""
    from concurrent.futures import ThreadPoolExecutor

    from braid.format.layout import chunk_key

    keys = [chunk_key(ref, i) for ref in refs for i in range(per_backup)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda key: store.put(key, b"c", durable=False), keys))


def _plan(repository: Any, keys: Any, counting: Counting, from_catalog: bool) -> dict[str, float]:
    from braid.ops.retention import RetentionPolicy, plan_prune

    counting.reset()
    started = time.perf_counter()
    plan = plan_prune(repository, RetentionPolicy.of(**RULES), keys, from_catalog=from_catalog)
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "manifest_gets": counting.manifest_gets,
        "lists": counting.lists,
        "listed_objects": counting.listed_objects,
        "prefix_lists": counting.prefix_lists,
        "forget": len(plan.forget),
        "keep": len(plan.keep),
    }


def _measure(ctx: Context, store: Any, key_file: Path, count: int, names: int, recent: int, per_backup: int) -> dict[str, dict[str, float]]:
    from braid.adapters.local.keys import LocalKeyFile
    from braid.format.ids import BackupRef
    from braid.format.repository import Repository
    from braid.ops.catalog import read_catalog
    from braid.ops.retention import RetentionPolicy, execute_prune, plan_prune

    ctx.log(f"prune: writing {count} backups ...")
    _populate(ctx, store, key_file, count, names, recent, per_backup)
    keys = LocalKeyFile.open(key_file)
    counting = Counting(store)
    repository = Repository.open(counting)  # type: ignore[arg-type]
    _chunks(store, repository.backups(), per_backup)
    read_catalog(repository)  # the snapshot the previous scheduled run left
    figures = {"catch-up catalog": _plan(repository, keys, counting, True), "catch-up host": _plan(repository, keys, counting, False)}
    ctx.log("prune: pruning, then one new backup per name ...")
    execute_prune(repository, plan_prune(repository, RetentionPolicy.of(**RULES), keys, from_catalog=True))
    from bench_lib.benchmarks.catalog import _manifest
    from braid.format.keys import encryption_context
    from braid.format.layout import manifest_key
    from braid.ops.catalog import write_summary

    now = datetime.now(UTC)
    for n in range(names):
        ref = BackupRef.new(f"db{n:02d}", now - timedelta(minutes=5))
        key, wrapped = keys.generate_data_key(encryption_context(repository.config.id, str(ref)))
        manifest = _manifest(repository.config.id, ref, key, wrapped, now - timedelta(minutes=5), per_backup)
        write_summary(store, manifest, key)
        store.put(manifest_key(ref), manifest.seal(key), create_only=True)
        _chunks(store, [ref], per_backup)
    read_catalog(repository, rebuild=True)
    figures["steady catalog"] = _plan(repository, keys, counting, True)
    figures["steady host"] = _plan(repository, keys, counting, False)
    return figures


def run(ctx: Context) -> Section:
    args = ctx.args
    count, names, recent = args.backups, max(1, args.names), min(args.recent, args.backups)
    section = Section(NAME, f"retention planning at {count:,} backups over {names} names, {args.chunks_per_backup} chunks each ({RULES})")
    work = ctx.scratch("prune")
    os.environ["XDG_CONFIG_HOME"] = str(work / "config")
    results: dict[str, dict[str, dict[str, float]]] = {}
    for target in [t.strip() for t in args.targets.split(",") if t.strip()]:
        run_dir = work / f"{target}-{os.getpid()}"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        try:
            if target == "local":
                from braid.adapters.local.store import LocalStore

                results[target] = _measure(ctx, LocalStore(run_dir / "repo"), run_dir / "master.key", count, names, recent, args.chunks_per_backup)
            elif target == "s3":
                server = s3proxy.start_moto(run_dir, ctx.venv_bin, "moto-s3")
                try:
                    os.environ.update({**s3proxy.credentials_env(), "AWS_ENDPOINT_URL": server.endpoint})
                    from braid.adapters.aws.clients import s3_client
                    from braid.adapters.aws.s3 import S3Store

                    client = s3_client(concurrency=16, endpoint_url=server.endpoint)
                    client.create_bucket(Bucket=BUCKET)
                    store = S3Store(client, BUCKET, "repo")
                    results[target] = _measure(ctx, store, run_dir / "master.key", count, names, recent, args.chunks_per_backup)
                finally:
                    server.stop()
            else:
                section.notes.append(f"unknown target {target!r} ignored (use local, s3)")
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
    columns = ["repository", "case", "planner", "seconds", "manifest GETs", "LISTs", "objects listed", "prefix LISTs", "keep", "forget"]
    rows = []
    for target, cases in results.items():
        for case, f in cases.items():
            phase, planner = case.split()
            rows.append([target, phase, planner, round(f["seconds"], 3), f["manifest_gets"], f["lists"], f["listed_objects"], f["prefix_lists"], f["keep"], f["forget"]])
    section.tables.append(Table("plan_prune, in-process", columns, rows))
    section.facts = {"backups": count, "figures": {t: {c: {k: round(v, 3) for k, v in f.items()} for c, f in cases.items()} for t, cases in results.items()}}
    section.notes.append("catalog: the scheduled prune's planner (from_catalog); host: braid prune's (every manifest, every chunk key listed)")
    return section
