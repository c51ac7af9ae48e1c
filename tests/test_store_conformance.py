"""One set of ObjectStore tests, run against every backend.

The repository format relies only on what these tests pin down, so a backup
written through one store reads back through any other. S3 runs on moto.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from botocore.exceptions import ClientError
from botocore.response import StreamingBody
from moto import mock_aws

from braid.adapters.aws.clients import HOST, s3_client
from braid.adapters.aws.retries import RetrySettings
from braid.adapters.aws.s3 import S3Store, map_error, parse_s3_url
from braid.adapters.local.store import LocalStore
from braid.errors import AlreadyExistsError, IntegrityError, NotFoundError, RepositoryError, StorageError, UsageError
from braid.format.checksum import stored_checksum
from braid.ports.store import ListingAfter, ObjectStore, PrefixListing, child_prefixes, list_after, put_pieces, read_object, read_range

BUCKET = "braid-conformance"


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "local":
        yield LocalStore(tmp_path / "repo")
        return
    request.getfixturevalue("aws_env")
    with mock_aws():
        client = s3_client(region="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield S3Store(client, BUCKET, "team/repo")


def keys(store: ObjectStore, prefix: str = "") -> list[str]:
    return [info.key for info in store.list(prefix)]


def test_put_get_head(store: ObjectStore) -> None:
    data = os.urandom(3000)
    store.put("data/a", data)
    assert store.get("data/a") == data
    info = store.head("data/a")
    assert info is not None and info.key == "data/a" and info.size == 3000
    assert store.head("data/missing") is None


def test_put_pieces_stores_them_end_to_end_with_their_checksum_and_create_only(store: ObjectStore) -> None:
    """A pack's frames go up as one object, from their own buffers where the store can (S3), joined where not."""
    codec_buffer = bytearray(os.urandom(5000))
    pieces = [os.urandom(3000), memoryview(codec_buffer)[:4000], bytearray(b"tail")]
    whole = b"".join(bytes(p) for p in pieces)
    put_pieces(store, "data/pack", pieces, checksum=stored_checksum(whole), create_only=True)
    assert store.get("data/pack") == whole and store.get_range("data/pack", 3000, 4000) == bytes(codec_buffer[:4000])
    info = store.head("data/pack")
    assert info is not None and info.size == len(whole) and info.checksum in (None, stored_checksum(whole))
    with pytest.raises(AlreadyExistsError):
        put_pieces(store, "data/pack", pieces[:1], create_only=True)
    with pytest.raises(StorageError, match="checksum mismatch"):
        put_pieces(store, "data/other", pieces, checksum=stored_checksum(whole[:-1]), create_only=True)
    assert store.get("data/pack") == whole and keys(store, "data/") == ["data/pack"]


def test_put_accepts_memoryview_slices_and_bytearrays(store: ObjectStore) -> None:
    buffer = bytearray(os.urandom(4096))
    store.put("a", memoryview(buffer)[100:1100])
    store.put("b", buffer)
    store.put("empty", b"")
    assert store.get("a") == bytes(buffer[100:1100])
    assert store.get("b") == bytes(buffer)
    assert store.get("empty") == b""


def test_get_into_reuses_the_buffer_and_never_resizes_it(store: ObjectStore) -> None:
    big, small = os.urandom(50_000), os.urandom(1_000)
    store.put("big", big)
    store.put("small", small)
    buffer = bytearray(20_000)
    alive = memoryview(buffer)  # another thread's view of the previous chunk
    assert bytes(read_object(store, "big", buffer)) == big  # too big: read elsewhere
    assert len(buffer) == 20_000
    view = read_object(store, "small", buffer)
    assert bytes(view) == small
    assert isinstance(view, memoryview) and view.obj is buffer  # reused, not replaced
    alive.release()
    with pytest.raises(NotFoundError):
        read_object(store, "nope", buffer)


def test_get_range(store: ObjectStore) -> None:
    data = bytes(range(256)) * 4
    store.put("obj", data)
    assert store.get_range("obj", 0, 10) == data[:10]
    assert store.get_range("obj", 500, 24) == data[500:524]
    assert store.get_range("obj", 1000, 100) == data[1000:]  # a range past the end is cut short
    assert store.get_range("obj", 5, 0) == b""


def test_get_range_into_reuses_the_buffer_and_cuts_a_range_past_the_end(store: ObjectStore) -> None:
    data = os.urandom(5_000)
    store.put("obj", data)
    buffer = bytearray(2_000)
    view = read_range(store, "obj", 100, 1_500, buffer)
    assert bytes(view) == data[100:1_600]
    assert isinstance(view, memoryview) and view.obj is buffer  # the worker's lane buffer, not a fresh one
    assert bytes(read_range(store, "obj", 4_000, 1_500, buffer)) == data[4_000:]  # past the end: cut short, as get_range
    assert bytes(read_range(store, "obj", 0, 3_000, buffer)) == data[:3_000]  # too big: read elsewhere
    assert len(buffer) == 2_000  # never resized: another thread may hold a view of it
    assert bytes(read_range(store, "obj", 7, 0, buffer)) == b""
    with pytest.raises(NotFoundError):
        read_range(store, "data/nope", 0, 5, buffer)


def test_a_ranged_read_that_ends_short_is_an_error_not_a_short_chunk(aws_env: None) -> None:
    """botocore's body counts what arrives: a connection that closes early must fail the read (the worker then retries)."""

    class ShortBodies:
        """A real client whose GET responses lose their last bytes on the way, as over a dropped connection."""

        def __init__(self, client: Any) -> None:
            self.client = client

        def get_object(self, **kwargs: Any) -> dict[str, Any]:
            response = dict(self.client.get_object(**kwargs))
            body = response["Body"].read()
            response["Body"] = StreamingBody(io.BytesIO(body[:-3]), len(body))
            return response

    with mock_aws():
        client = s3_client(region="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        S3Store(client, BUCKET).put("obj", os.urandom(4_000))
        store = S3Store(cast(Any, ShortBodies(client)), BUCKET)
        with pytest.raises(StorageError, match="reading s3://braid-conformance/obj"):
            store.get_range_into("obj", 10, 3_000, bytearray(3_000))


def test_missing_object(store: ObjectStore) -> None:
    with pytest.raises(NotFoundError, match="nope"):
        store.get("data/nope")
    with pytest.raises(NotFoundError):
        store.get_range("data/nope", 0, 5)


def test_list_in_key_order_under_prefix(store: ObjectStore) -> None:
    names = ["m/b", "m/a/2", "m/a/10", "m/ab", "n/x", "m-z", "ma"]
    for name in names:
        store.put(name, name.encode())
    assert keys(store) == sorted(names)
    assert keys(store, "m/") == ["m/a/10", "m/a/2", "m/ab", "m/b"]
    assert keys(store, "m/ab") == ["m/ab"]
    assert keys(store, "zzz/") == []
    sizes = {info.key: info.size for info in store.list("m/")}
    assert sizes["m/a/10"] == len(b"m/a/10")


def test_list_prefix_is_a_string_prefix_not_a_directory(store: ObjectStore) -> None:
    for name in ["m/a/1", "m/ab", "m/b"]:
        store.put(name, b"")
    assert keys(store, "m/a") == ["m/a/1", "m/ab"]


def test_overwrite_replaces_whole_object(store: ObjectStore) -> None:
    store.put("k", b"old" * 1000)
    store.put("k", b"new")
    assert store.get("k") == b"new"
    assert keys(store) == ["k"]


def test_create_only_refuses_existing_and_leaves_it_intact(store: ObjectStore) -> None:
    store.put("chunk", b"published", create_only=True)
    with pytest.raises(AlreadyExistsError, match="chunk"):
        store.put("chunk", b"late worker", create_only=True)
    assert store.get("chunk") == b"published"
    assert keys(store) == ["chunk"]


def test_replacing_rewrites_only_the_version_that_was_read(store: ObjectStore) -> None:
    """rekey's switch: a manifest replaced as the version read (S3: If-Match), never one changed since."""
    store.put("manifest", b"as read")
    read = store.head("manifest")
    assert read is not None and read.version
    store.put("manifest", b"rewritten", replacing=read.version)
    assert store.get("manifest") == b"rewritten"
    with pytest.raises(IntegrityError, match="changed or went since it was read; nothing was replaced"):
        store.put("manifest", b"stale writer", replacing=read.version)  # the version it read is gone
    assert store.get("manifest") == b"rewritten"
    store.delete(["manifest"])
    with pytest.raises(IntegrityError, match="changed or went since it was read"):
        store.put("manifest", b"after a prune", replacing=read.version)
    assert store.head("manifest") is None
    assert keys(store) == []  # no temporary file left behind either


def test_checksum_verified_on_put(store: ObjectStore) -> None:
    data = os.urandom(2048)
    store.put("good", data, checksum=stored_checksum(data))
    assert store.get("good") == data


def test_checksum_mismatch_refused_and_nothing_stored(store: ObjectStore) -> None:
    data = os.urandom(2048)
    wrong = stored_checksum(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(StorageError, match="checksum"):
        store.put("bad", data, checksum=wrong)
    assert store.head("bad") is None
    assert keys(store) == []
    store.put("kept", b"original")
    with pytest.raises(StorageError):
        store.put("kept", data, checksum=wrong)
    assert store.get("kept") == b"original"


def test_delete_missing_is_ok(store: ObjectStore) -> None:
    store.put("x/1", b"1")
    store.put("x/2", b"2")
    store.delete(["x/1", "x/never-existed"])
    assert keys(store) == ["x/2"]
    store.delete([])
    assert store.head("x/1") is None


def test_delete_more_than_one_batch(store: ObjectStore) -> None:
    names = [f"many/{i:05d}" for i in range(1003)]
    for name in names:
        store.put(name, b"")
    store.put("other", b"stays")
    store.delete(iter(names))  # a generator, as the pipeline passes listings through
    assert keys(store) == ["other"]


def test_head_checksum_is_the_stored_checksum_where_the_store_keeps_one(store: ObjectStore) -> None:
    """S3 keeps the CRC64NVME it verified, and quick verify compares it with the
    manifest; the local store keeps none (it checks the checksum in `put`), so
    verification reads the object instead."""
    keeps = isinstance(store, S3Store)
    data = os.urandom(10_000)
    store.put("c", data, checksum=stored_checksum(data))
    info = store.head("c")
    assert info is not None and info.checksum == (stored_checksum(data) if keeps else None)
    store.put("d", memoryview(bytearray(data))[1:])  # no checksum given: S3 still gets one
    info = store.head("d")
    assert info is not None and info.checksum == (stored_checksum(data[1:]) if keeps else None)


def test_s3_url_and_prefix(aws_env: None) -> None:
    assert parse_s3_url("s3://my-bucket") == ("my-bucket", "")
    assert parse_s3_url("s3://my-bucket/a/b/") == ("my-bucket", "a/b")
    for bad in ("my-bucket/a", "s3://", "s3://A_B/x", "s3://ok-bucket/a//b", "s3://ok-bucket/../x", "http://b/x"):
        with pytest.raises(UsageError):
            parse_s3_url(bad)
    with mock_aws():
        client = s3_client(region="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        store = S3Store.from_url(f"s3://{BUCKET}/p/q/", client=client)
        assert store.url == f"s3://{BUCKET}/p/q"
        store.put("obj", b"1")
        assert [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET)["Contents"]] == ["p/q/obj"]
        assert S3Store(client, BUCKET).url == f"s3://{BUCKET}"


def test_s3_missing_bucket_is_a_repository_error(aws_env: None) -> None:
    with mock_aws():
        store = S3Store(s3_client(region="us-east-1"), "no-such-bucket", "repo")
        with pytest.raises(RepositoryError, match="no-such-bucket"):
            store.get("config.json")
        with pytest.raises(RepositoryError):
            list(store.list(""))


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


def test_s3_error_messages_name_the_object_and_the_fix() -> None:
    denied = map_error(_client_error("AccessDenied", 403), action="writing", bucket="b", key="r/k", permission="s3:PutObject")
    assert isinstance(denied, StorageError) and "s3://b/r/k" in str(denied) and "s3:PutObject" in str(denied)
    digest = map_error(_client_error("BadDigest", 400), action="writing", bucket="b", key="k", permission="s3:PutObject")
    assert "checksum mismatch" in str(digest)
    slow = map_error(_client_error("SlowDown", 503), action="writing", bucket="b", key="k", permission="s3:PutObject")
    assert "SlowDown" in str(slow) and "--concurrency" in str(slow)
    assert isinstance(map_error(_client_error("NoSuchKey", 404), action="reading", bucket="b", key="k", permission="x"), NotFoundError)


def test_s3_client_settings(aws_env: None) -> None:
    """Host cost: no SHA-256 of every payload byte (the CRC64NVME covers integrity), pool fits the threads."""
    client = s3_client(region="us-east-1", concurrency=100)
    assert client.meta.config.s3["payload_signing_enabled"] is False
    assert client.meta.config.max_pool_connections >= 100
    assert client.meta.config.retries["mode"] == "standard"
    assert client.meta.config.retries["total_max_attempts"] == HOST.attempts
    with pytest.raises(UsageError):
        s3_client(region="us-east-1", retries=RetrySettings("fast", 3))


def test_child_prefixes_name_each_directory_once_without_listing_below(store: ObjectStore) -> None:
    """Finding backups under data/NAME/ must not list their chunks (a LIST with a delimiter on S3)."""
    for key in ("data/db/1/0000000000", "data/db/1/0000000001", "data/db/2/lease", "data/db2/3/0000000000", "data/top", "manifests/db/1.json"):
        store.put(key, b"x")
    assert isinstance(store, PrefixListing)  # both backends answer without a full listing
    assert child_prefixes(store, "data/") == ["data/db/", "data/db2/"]
    assert child_prefixes(store, "data/db/") == ["data/db/1/", "data/db/2/"]
    assert child_prefixes(store, "data/db/1/") == []
    assert child_prefixes(store, "staging/") == []


def test_list_after_starts_past_a_key(store: ObjectStore) -> None:
    for index in range(5):
        store.put(f"data/db/1/{index:010d}", b"x")
    store.put("data/db/1/lease", b"x")
    store.put("data/db/10/0000000000", b"x")  # a string prefix, as on S3
    after = [info.key for info in list_after(store, "data/db/1/", "data/db/1/0000000002")]
    assert after == ["data/db/1/0000000003", "data/db/1/0000000004", "data/db/1/lease"]
    assert [info.key for info in list_after(store, "data/db/1/", "")] == [f"data/db/1/{i:010d}" for i in range(5)] + ["data/db/1/lease"]
    if isinstance(store, ListingAfter):  # S3: StartAfter, so a later slice costs only its own pages
        assert [info.key for info in store.list_after("data/db/1/", "data/db/1/0000000003")] == after[1:]
