"""The driver loop both engines share, and the local engine's sink on it.

The cost test exists because the local engine once scanned every future
submitted so far after each chunk: O(n^2) over a stream, ~160 s of CPU per
TiB at 64 MiB chunks. It counts what the sink does with futures, so it does
not depend on timing on a busy machine.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import braid.engine.driver
from braid.engine.driver import Release, drive
from braid.engine.local_sink import LocalChunkSink
from braid.engine.stream import InputSource, Piece
from braid.errors import InputError, LimitError, StorageError
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.layout import DATA
from braid.ports.store import Buffer, ObjectInfo


def write_input(tmp_path: Path, name: str, data: bytes) -> InputSource:
    path = tmp_path / name
    path.write_bytes(data)
    return InputSource(int(name.removeprefix("in")), str(path), str(path))


class RecordingSink:
    """Keeps what the driver sends; releases each buffer at once."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.chunks: list[tuple[int, int, int, int, bytes]] = []  # index, input, number, offset, data
        self.ends: list[tuple[int, int]] = []
        self.aborted: BaseException | None = None
        self.finished = False

    def accept(self, index: int, piece: Piece, release: Release) -> None:
        try:
            if index == self.fail_at:
                raise StorageError(f"chunk {index} could not be stored")
            self.chunks.append((index, piece.input_index, piece.number, piece.offset, bytes(piece.data)))
        finally:
            release()

    def end_input(self, input_index: int, length: int) -> None:
        self.ends.append((input_index, length))

    def finish(self) -> int:
        self.finished = True
        return len(self.chunks)

    def abort(self, error: BaseException) -> None:
        self.aborted = error


def reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("braid-read-")]


def test_pieces_get_dense_global_indexes_and_inputs_their_lengths(tmp_path: Path) -> None:
    a = write_input(tmp_path, "in0", os.urandom(1000))
    b = write_input(tmp_path, "in1", os.urandom(250))
    empty = write_input(tmp_path, "in2", b"")
    sink = RecordingSink()
    result = drive([a, b, empty], sink, buffers=3, chunk_size=100, backup="db@x")
    assert result.outcome == result.chunks == 13
    assert [c[0] for c in sink.chunks] == list(range(13))
    assert result.input_lengths == {0: 1000, 1: 250, 2: 0} == dict(sink.ends)
    for index in (0, 1):
        pieces = sorted((c[2], c[3], c[4]) for c in sink.chunks if c[1] == index)
        assert [p[0] for p in pieces] == list(range(len(pieces)))
        assert [p[1] for p in pieces] == [n * 100 for n in range(len(pieces))]
        assert b"".join(p[2] for p in pieces) == Path(str([a, b][index].path)).read_bytes()
    assert 1 <= result.max_buffers_in_flight <= 3
    assert sink.finished and sink.aborted is None


def test_a_sink_failure_stops_the_readers_and_aborts_the_sink_with_it(tmp_path: Path) -> None:
    source = write_input(tmp_path, "in0", os.urandom(100 * 50))
    sink = RecordingSink(fail_at=5)
    with pytest.raises(StorageError, match="chunk 5 could not be stored") as raised:
        drive([source], sink, buffers=3, chunk_size=100, backup="db@x")
    assert sink.aborted is raised.value
    assert not sink.finished
    assert [c[0] for c in sink.chunks] == [0, 1, 2, 3, 4]
    assert reader_threads() == []


def test_a_reader_failure_aborts_the_sink(tmp_path: Path) -> None:
    missing = InputSource(0, str(tmp_path / "gone"), str(tmp_path / "gone"))
    sink = RecordingSink()
    with pytest.raises(InputError, match="cannot open input"):
        drive([missing], sink, buffers=3, chunk_size=100, backup="db@x")
    assert isinstance(sink.aborted, InputError)


def test_more_chunks_than_one_data_key_may_seal_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(braid.engine.driver, "MAX_CHUNKS_PER_KEY", 3)
    source = write_input(tmp_path, "in0", os.urandom(100 * 4))
    sink = RecordingSink()
    with pytest.raises(LimitError, match=r"backup db@x would exceed 2\^32 chunks under one data key; use a larger --chunk-size"):
        drive([source], sink, buffers=3, chunk_size=100, backup="db@x")
    assert [c[0] for c in sink.chunks] == [0, 1, 2]
    assert isinstance(sink.aborted, LimitError)


# -- the local sink: work per chunk does not grow with the stream ----------------


class MemoryStore:
    """Just enough of an ObjectStore for store_chunk, with no disk in the measurement."""

    url = "memory:"

    def __init__(self, fail_after: int | None = None) -> None:
        self.objects: dict[str, bytes] = {}
        self.fail_after = fail_after
        self.lock = threading.Lock()

    def put(self, key: str, data: Buffer, *, checksum: str | None = None, create_only: bool = False, durable: bool = True) -> None:
        with self.lock:
            if self.fail_after is not None and len(self.objects) >= self.fail_after:
                raise StorageError(f"repository disk is full while writing {key}")
            self.objects[key] = bytes(data)

    def sync(self, keys: Any) -> None: ...

    def get(self, key: str) -> bytes:
        return self.objects[key]

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.objects[key][start : start + length]

    def head(self, key: str) -> ObjectInfo | None:
        return ObjectInfo(key, len(self.objects[key])) if key in self.objects else None

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        return iter([ObjectInfo(k, len(v)) for k, v in sorted(self.objects.items()) if k.startswith(prefix)])

    def delete(self, keys: Any) -> None:
        for key in keys:
            self.objects.pop(key, None)


class CountingFuture(Future[Any]):
    """A future that counts every question its consumer asks it."""

    def __init__(self, tick: Callable[[], None]) -> None:
        super().__init__()
        self._tick = tick

    def done(self) -> bool:
        self._tick()
        return super().done()

    def cancelled(self) -> bool:
        self._tick()
        return super().cancelled()

    def running(self) -> bool:
        self._tick()
        return super().running()

    def cancel(self) -> bool:
        self._tick()
        return super().cancel()

    def result(self, timeout: float | None = None) -> Any:
        self._tick()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._tick()
        return super().exception(timeout)

    def add_done_callback(self, fn: Callable[[Future[Any]], object]) -> None:
        self._tick()
        super().add_done_callback(fn)


class CountingExecutor(Executor):
    """A thread pool whose futures count their use and are watched for how long they live."""

    def __init__(self, workers: int) -> None:
        self._inner = ThreadPoolExecutor(max_workers=workers)
        self._lock = threading.Lock()
        self.calls = 0
        self.calls_at_submit: list[int] = []
        self._live: weakref.WeakSet[Future[Any]] = weakref.WeakSet()
        self.peak_live = 0

    def _tick(self) -> None:
        with self._lock:
            self.calls += 1

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            self.calls_at_submit.append(self.calls)
        self.peak_live = max(self.peak_live, len(self._live))  # futures someone still holds
        future = CountingFuture(self._tick)
        self._live.add(future)

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        self._inner.submit(run)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._inner.shutdown(wait=wait, cancel_futures=cancel_futures)


def store_stream(tmp_path: Path, executor: Executor, store: MemoryStore, chunks: int, workers: int) -> list[Any]:
    source = write_input(tmp_path, "in0", os.urandom(64 * chunks))
    sink = LocalChunkSink(executor, store, BackupRef.new("db"), DataKey(os.urandom(32)), 1, lambda event: None)
    result = drive([source], sink, buffers=workers + 2, chunk_size=64, backup="db@x")
    return result.outcome


def test_work_per_chunk_does_not_grow_with_the_stream(tmp_path: Path) -> None:
    chunks, workers, window = 4000, 2, 1000
    store = MemoryStore()
    with CountingExecutor(workers) as executor:
        entries = store_stream(tmp_path, executor, store, chunks, workers)
    assert [e.index for e in entries] == list(range(chunks))
    assert len([k for k in store.objects if k.startswith(DATA)]) == chunks
    at = executor.calls_at_submit
    first, last = at[window] - at[0], at[-1] - at[-1 - window]
    # A few calls per chunk (callback, outcome), in the first thousand chunks
    # as in the last; a scan of all earlier futures makes the last window
    # thousands of times dearer than the first.
    assert first <= 10 * window
    assert last <= first * 1.2 + 100
    assert executor.calls <= 10 * chunks
    # Only futures in flight are held: bounded by the pool, not the stream.
    assert executor.peak_live <= (workers + 2) + 2 * workers


def test_a_failed_chunk_stops_the_stream_and_nothing_is_left_running(tmp_path: Path) -> None:
    store = MemoryStore(fail_after=10)
    with CountingExecutor(2) as executor:
        with pytest.raises(StorageError, match="disk is full"):
            store_stream(tmp_path, executor, store, 2000, 2)
        # The failure surfaced within a pool's worth of chunks, not at the end of the stream.
        assert len(executor.calls_at_submit) < 100
    assert reader_threads() == []


class InterruptedAfterSubmit(ThreadPoolExecutor):
    """An executor whose submit() is followed by a signal: KeyboardInterrupt after the chunk
    was handed to a worker, before the sink could record its future (the race a SIGTERM hits)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        super().submit(fn, *args, **kwargs)
        raise KeyboardInterrupt


class SlowStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.go_on = threading.Event()

    def put(self, key: str, data: Buffer, *, checksum: str | None = None, create_only: bool = False, durable: bool = True) -> None:
        self.writing.set()
        self.go_on.wait(10)
        super().put(key, data, checksum=checksum, create_only=create_only, durable=durable)


def test_abort_returns_only_once_no_worker_is_storing_a_chunk_even_one_it_never_recorded() -> None:
    store = SlowStore()
    with InterruptedAfterSubmit(2) as executor:
        sink = LocalChunkSink(executor, store, BackupRef.new("db"), DataKey(os.urandom(32)), 1, lambda event: None)
        released: list[bool] = []
        buffer = bytearray(os.urandom(64))
        with pytest.raises(KeyboardInterrupt):
            sink.accept(0, Piece(0, 0, 0, buffer, 64), lambda: released.append(True))
        assert store.writing.wait(10)  # the worker is inside store_chunk, unknown to the sink's futures
        aborted = threading.Event()
        aborter = threading.Thread(target=lambda: (sink.abort(KeyboardInterrupt()), aborted.set()))
        aborter.start()
        assert not aborted.wait(0.3), "abort returned while a worker was still storing a chunk"
        store.go_on.set()
        assert aborted.wait(10)
        aborter.join()
        # What the caller discards now is everything that will ever be written.
        assert [k for k in store.objects if k.startswith(DATA)] != []
        assert released == [True]
