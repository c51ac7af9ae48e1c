"""Policy `direct-restore` (braid.ops.pg_direct): large files of `restore --pgdata` written with O_DIRECT, byte-exact.

The files are fed through the real extraction (braid.ops.pgdata.TarExtract) in
pieces of random lengths, as decoded chunks arrive, so ranges start and end
off block boundaries. The `disk` fixture is tmp_path when that is on ext4, xfs or
btrfs, else a directory beside the tests (a checkout is on a disk): the tests
check that O_DIRECT was taken, and that a file system refusing it loses nothing.
"""

from __future__ import annotations

import errno
import fcntl
import io
import os
import random
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from braid.contract import ENV_DIRECT_RESTORE
from braid.ops import pg_direct
from braid.ops.pg_direct import BLOCK, DIRECT_MIN, PIECE, DirectWriter
from braid.ops.pgdata import TarExtract

SIZES = (0, 1, BLOCK - 1, BLOCK, DIRECT_MIN - 1, DIRECT_MIN, DIRECT_MIN + BLOCK + 17, 3 * PIECE + 1, 2 * PIECE)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A directory where the policy applies: tmp_path, or one made beside the tests when tmp_path is a tmpfs."""
    if pg_direct.applies(str(tmp_path)):
        yield tmp_path
        return
    place = Path(tempfile.mkdtemp(prefix=".direct-", dir=Path(__file__).parent))
    try:
        assert pg_direct.applies(str(place)), f"neither {tmp_path} nor {place} is on ext4, xfs or btrfs"
        yield place
    finally:
        shutil.rmtree(place, ignore_errors=True)


def _tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.mode, info.mtime, info.size = 0o600, 1_700_000_000, len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _extract(stream: bytes, directory: Path, seed: int) -> TarExtract:
    extract = TarExtract("test", str(directory), 2)
    rng, view, at = random.Random(seed), memoryview(stream), 0
    while at < len(view):
        step = rng.choice((1, 511, BLOCK + 3, 70_001, PIECE + 5, 3 * PIECE))
        extract.write(view[at : at + step])
        at += step
    extract.finish()
    return extract


def _files(seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {f"base/1/{size}": rng.randbytes(size) for size in SIZES}


def _opened(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    taken: list[bool] = []
    real = pg_direct.open_direct

    def record(path: str, flags: int, mode: int) -> tuple[int, bool]:
        fd, direct = real(path, flags, mode)
        taken.append(bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT) and direct)
        return fd, direct

    monkeypatch.setattr(pg_direct, "open_direct", record)
    return taken


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_large_files_are_written_direct_and_exact(disk: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    tmp_path = disk
    taken = _opened(monkeypatch)
    files = _files(seed)
    _extract(_tar(files), tmp_path / "data", seed)
    for name, data in files.items():
        path = tmp_path / "data" / name
        assert path.read_bytes() == data, name
        assert path.stat().st_mtime == 1_700_000_000
        assert path.stat().st_mode & 0o7777 == 0o600
    assert taken == [True] * sum(1 for size in SIZES if size >= DIRECT_MIN)


def test_policy_off_writes_through_the_page_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_DIRECT_RESTORE, "off")
    taken = _opened(monkeypatch)
    files = _files(4)
    _extract(_tar(files), tmp_path / "data", 4)
    assert taken == []
    assert all((tmp_path / "data" / name).read_bytes() == data for name, data in files.items())


def test_a_refused_write_goes_on_through_the_page_cache(disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp_path = disk
    real = os.pwrite
    refused: list[int] = []

    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT and offset >= PIECE:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, offset)

    monkeypatch.setattr(pg_direct.os, "pwrite", pwrite)
    data = random.Random(5).randbytes(3 * PIECE + 1)
    path = tmp_path / "f"
    fd, direct = pg_direct.open_direct(str(path), os.O_WRONLY | os.O_CREAT, 0o600)
    writer = DirectWriter(len(data))
    writer.direct = direct
    assert writer.plan(memoryview(data)[:1000], 0) == []  # less than a block: kept for the next range
    for position, parts in writer.plan(memoryview(data)[1000:], 1000):
        writer.write(fd, position, parts)
    writer.end(fd)
    assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT
    os.close(fd)
    assert len(refused) == 1 and not writer.direct
    assert path.read_bytes() == data


def test_a_file_system_refusing_o_direct_at_open_gets_a_plain_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.open

    def refusing(path: str, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real(path, flags, mode)

    monkeypatch.setattr(pg_direct.os, "open", refusing)
    files = _files(6)
    _extract(_tar(files), tmp_path / "data", 6)
    assert all((tmp_path / "data" / name).read_bytes() == data for name, data in files.items())


def test_other_open_errors_are_not_swallowed(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        pg_direct.open_direct(str(tmp_path / "missing" / "f"), os.O_WRONLY | os.O_CREAT, 0o600)


def test_file_system_is_the_longest_mount_point_above(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 27 0:21 / / rw,relatime - ext4 /dev/vda rw\n"
        "23 22 0:22 / /mnt/nfs\\040share rw,relatime shared:5 - nfs4 server:/x rw\n"
        "24 22 0:23 / /mnt rw,relatime - xfs /dev/vdb rw\n"
        "25 22 0:24 / /mn rw,relatime - tmpfs tmpfs rw\n"
    )
    assert pg_direct.file_system("/var/lib/pg", str(info)) == "ext4"
    assert pg_direct.file_system("/mnt/data", str(info)) == "xfs"
    assert pg_direct.file_system("/mnt/nfs share/data", str(info)) == "nfs4"
    assert pg_direct.file_system("/mnt", str(info)) == "xfs"
    assert pg_direct.file_system("/x", str(tmp_path / "absent")) is None


def test_applies_only_to_local_block_file_systems(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_direct, "file_system", lambda directory: "nfs4")
    assert not pg_direct.applies("/anywhere")
    monkeypatch.setattr(pg_direct, "file_system", lambda directory: "xfs")
    assert pg_direct.applies("/anywhere")
    monkeypatch.setenv(ENV_DIRECT_RESTORE, "off")
    assert not pg_direct.applies("/anywhere")


@pytest.mark.parametrize("seed", [7, 8])
def test_pieces_written_out_of_order_by_several_threads_make_the_file(disk: Path, seed: int) -> None:
    tmp_path = disk
    rng = random.Random(seed)
    data = rng.randbytes(5 * PIECE + 3 * BLOCK + 123)
    cuts = sorted(rng.sample(range(1, len(data)), 40))
    path = tmp_path / "f"
    fd, direct = pg_direct.open_direct(str(path), os.O_WRONLY | os.O_CREAT, 0o600)
    assert direct
    writer = DirectWriter(len(data))
    pieces = []
    for start, stop in zip([0, *cuts], [*cuts, len(data)], strict=True):
        pieces += writer.plan(memoryview(data)[start:stop], start)
    assert all(position % BLOCK == 0 and sum(map(len, parts)) % BLOCK == 0 for position, parts in pieces)
    assert all(sum(map(len, parts)) <= PIECE for _, parts in pieces)
    rng.shuffle(pieces)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda piece: writer.write(fd, piece[0], piece[1]), pieces))
    writer.end(fd)
    os.close(fd)
    assert path.read_bytes() == data
