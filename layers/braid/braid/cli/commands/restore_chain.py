"""`braid restore` of an incremental chain: `--pgdata DIR` (`--rebuild in-place` or `pg_combinebackup`) and `--chain -- COMMAND`.

Both open and authenticate every link first (exit 6 for a missing or
unreadable one) and check the disk (exit 3), so nothing is written for a
chain that cannot be restored. `--pgdata` rebuilds DIR one of two ways
(`--rebuild`, docs/databases-incremental.md): `in-place` (the default where
the work directory shares DIR's file system) applies every link onto one
tree in the work directory and renames it into DIR (braid.ops.pg_apply);
`pg_combinebackup` extracts every link and runs PostgreSQL's tool
(braid.ops.chain_restore).
"""

from __future__ import annotations

import argparse
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

from braid.cli.budget import check_restore_memory
from braid.cli.compose import key_service_on_demand, open_repository, repo_url
from braid.cli.progress import Progress
from braid.cli.render import operation_summary, print_json
from braid.errors import UsageError
from braid.format.ids import BackupRef
from braid.format.repository import Repository
from braid.ops.chain import open_chain
from braid.ops.chain_restore import ChainWork, check_disk, combine, find_tool, link_command, links_files, work_dir_for
from braid.ops.open import OpenedBackup
from braid.ops.pg_apply import ApplyTarget, ChainState
from braid.ops.pg_tree import finish_tree, move_into
from braid.ops.pgdata import PgDataTarget, check_pgdata
from braid.ops.restore import SharedDecoders, check_chunks_present, restore_backup
from braid.ops.restore_output import OutputTarget
from braid.ports.progress import ProgressFn

__all__ = ["REBUILDS", "restore_chain_generic", "restore_chain_pgdata"]

REBUILDS = ("in-place", "pg_combinebackup")


def _links(repository: Repository, head: OpenedBackup, args: argparse.Namespace) -> list[OpenedBackup]:
    links = open_chain(repository, BackupRef.parse(head.manifest.backup), key_service_on_demand(repository, args.key_file), opened=head)
    for link in links:  # every link's chunks listed before the first is written anywhere (exit 6 for one missing)
        check_restore_memory(link.manifest, args.workers)
        check_chunks_present(repository.store, link.manifest, link.key)
    return links


def restore_chain_pgdata(args: argparse.Namespace, progress: Progress, repository: Repository, head: OpenedBackup, directory: str) -> OpenedBackup:
    """Rebuild DIR from the chain ending at `head`; returns `head` (DIR then holds its state) for the recovery settings."""
    links = _links(repository, head, args)
    for link in links:
        if len(link.manifest.inputs) != 1:
            raise UsageError(f"backup {link.manifest.backup} of the chain has {len(link.manifest.inputs)} inputs; --pgdata restores one pg_basebackup tar per link")
    work_path = work_dir_for(directory, getattr(args, "work_dir", None))
    same = _same_file_system(work_path, directory)
    rebuild = getattr(args, "rebuild", None) or ("in-place" if same else "pg_combinebackup")
    if rebuild == "in-place":
        if not same:
            raise UsageError(f"--rebuild in-place builds the data directory in --work-dir {work_path} and renames it into {directory}: give a work directory on its file system")
        return _rebuild_in_place(args, progress, repository, links, work_path, directory)
    tool = find_tool("pg_combinebackup", getattr(args, "pg_bin", None))
    linked = links_files(tool) and same
    check_disk(links, work_path, directory, linked=linked)
    created = not os.path.exists(directory)
    work = ChainWork(work_path)
    try:
        paths = []
        for position, link in enumerate(links):
            path = work.link(position)
            progress.backup = link.manifest.backup
            target = PgDataTarget(f"link {position} ({link.manifest.backup})", path, max(2, args.workers))
            restore_backup(repository.store, link.manifest, link.key, [target], workers=args.workers, progress=progress)
            paths.append(path)
        progress.backup = head.manifest.backup
        try:
            combine(tool, paths, directory, link=linked)
        except BaseException:
            _empty(directory, remove=created)
            raise
    finally:
        work.close()
    return head


def _rebuild_in_place(
    args: argparse.Namespace, progress: Progress, repository: Repository, links: list[OpenedBackup], work_path: str, directory: str
) -> OpenedBackup:
    """Every link applied onto WORK/tree (braid.ops.pg_apply), made durable once, then renamed into DIR."""
    check_disk(links, work_path, None)
    work = ChainWork(work_path)
    # --link-decoders shared: one decoder pool and one set of chunk buffers for every link (made once, not per link);
    # each link's chunks were listed by _links.
    shared = SharedDecoders([link.manifest for link in links], args.workers) if getattr(args, "link_decoders", "shared") == "shared" else None
    try:
        tree = os.path.join(work.path, "tree")
        os.mkdir(tree, 0o700)
        state = ChainState(len(links))

        def apply(position: int, link: OpenedBackup) -> None:
            label = f"link {position} ({link.manifest.backup})"
            target = ApplyTarget(label, tree, position=position, backup=link.manifest.backup, state=state, writers=max(2, args.workers))
            restore_backup(repository.store, link.manifest, link.key, [target], workers=args.workers, progress=progress, shared=shared)

        # Two links at a time: the next one is read and decoded while this one is applied (ChainState.wait_turn).
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="braid-link") as pool:
            futures = [pool.submit(apply, position, link) for position, link in enumerate(links)]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                state.fail()
                for future in futures:
                    future.cancel()
                raise
        progress.backup = links[-1].manifest.backup
        finish_tree(tree, state.labels[-1].text)
        check_pgdata(directory)  # still empty (or absent): nothing came in meanwhile
        move_into(tree, directory)
    finally:
        if shared is not None:
            shared.close()
        work.close()
    return links[-1]


def _same_file_system(work: str, directory: str) -> bool:
    def device(path: str) -> int:
        while not os.path.exists(path):
            path = os.path.dirname(path)
        return os.stat(path).st_dev

    return device(os.path.dirname(work)) == device(directory)


def _empty(directory: str, *, remove: bool) -> None:
    """Leave DIR as found: removed if Braid's tool created it, else emptied (it was empty)."""
    if remove:
        shutil.rmtree(directory, ignore_errors=True)
        return
    for entry in os.listdir(directory) if os.path.isdir(directory) else []:
        path = os.path.join(directory, entry)
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)


def restore_chain_generic(args: argparse.Namespace, progress: Progress) -> int:
    """`--chain -- COMMAND`: each link, oldest first, through COMMAND ({link}, {link_id}, {dir}); the link directories are kept."""
    from braid.ops.consumer import Consumer

    if not args.run:
        raise UsageError("--chain restores each link through a command: give it after --, e.g. -- mbstream -x -C {dir}")
    if args.output:
        raise UsageError("--chain restores through the command after --, not to --output")
    repository = open_repository(repo_url(args.repo))
    keys = key_service_on_demand(repository, args.key_file)
    ref = BackupRef.parse(args.backup)
    from braid.ops.open import open_backup

    head = open_backup(repository, ref, keys)
    links = _links(repository, head, args)
    work_path = os.path.abspath(args.work_dir) if getattr(args, "work_dir", None) else None
    if work_path is None:
        raise UsageError("--chain needs --work-dir DIR: each link gets DIR/NN ({dir}) for the database's own prepare step afterwards")
    check_disk(links, work_path, None)
    work = ChainWork(work_path)
    for position, link in enumerate(links):
        path = work.link(position)
        os.mkdir(path, 0o700)
        consumer = Consumer(link_command(args.run, position, link.manifest.backup, path), pipes=args.pipes)
        consumer.check(link.manifest)
        progress.backup = link.manifest.backup

        def run(targets: list[OutputTarget], progress_fn: ProgressFn, link: OpenedBackup = link) -> None:
            restore_backup(repository.store, link.manifest, link.key, targets, workers=args.workers, progress=progress_fn, open_timeout=args.open_timeout)

        consumer.restore(link.manifest, run, progress)
    elapsed = progress.elapsed()
    summary = {**operation_summary(head.manifest, "restore", elapsed), "links": [link.manifest.backup for link in links], "work_dir": work_path}
    progress({"event": "done", **summary})
    if args.json:
        print_json({**summary, "elapsed": round(elapsed, 3)}, indent=None)
    return 0
