"""One set of MultipartStore tests, run against the in-memory fake and S3 (moto).

The agent's uploader and the pipeline's janitor rely only on what these
tests pin down, so what passes against the fake holds on S3. Where moto
differs from S3 (it checks no checksums, and a gone upload is a server
error for some calls) the S3 adapter is checked with botocore's Stubber
instead, at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import moto.s3.models
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from braid.adapters.aws.clients import s3_client
from braid.adapters.aws.s3 import S3Store
from braid.adapters.aws.s3_multipart import S3Multipart
from braid.adapters.local.store import LocalStore
from braid.errors import StorageError
from braid.format.checksum import crc64nvme, encode_crc64nvme, stored_checksum
from braid.ports.multipart import MultipartStore, SentPart, UploadGoneError
from braid.ports.pipeline import MultipartJanitor
from braid.ports.store import ObjectStore
from support.memory_multipart import MemoryMultipart

BUCKET = "braid-multipart"
PART = 1024  # moto's minimum part size is lowered to this


@dataclass
class Target:
    store: ObjectStore
    uploads: MultipartStore


@pytest.fixture(params=["memory", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Target]:
    if request.param == "memory":
        store = LocalStore(tmp_path / "repo")
        yield Target(store, MemoryMultipart(store, min_part_size=PART))
        return
    request.getfixturevalue("aws_env")
    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", PART)
    with mock_aws():
        client = s3_client(region="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        s3 = S3Store(client, BUCKET, "team/repo")
        yield Target(s3, S3Multipart(s3))


def crc(data: bytes) -> str:
    return encode_crc64nvme(crc64nvme(data))


def send(target: Target, key: str, upload_id: str, number: int, data: bytes) -> SentPart:
    return SentPart(number, target.uploads.upload_part(key, upload_id, number, memoryview(bytearray(data)), crc(data)), crc(data))


def test_parts_sent_in_any_order_complete_into_one_object(target: Target) -> None:
    parts = [os.urandom(PART), os.urandom(PART + 7), os.urandom(100)]
    whole = b"".join(parts)
    upload_id = target.uploads.create_upload("staging/s/in0/seg00000")
    sent = {n: send(target, "staging/s/in0/seg00000", upload_id, n, parts[n - 1]) for n in (3, 1, 2)}
    stored = target.uploads.complete_upload("staging/s/in0/seg00000", upload_id, [sent[1], sent[2], sent[3]], crc(whole), len(whole))
    assert stored in (None, stored_checksum(whole))  # None: the caller asks HEAD
    assert target.store.get("staging/s/in0/seg00000") == whole
    info = target.store.head("staging/s/in0/seg00000")
    assert info is not None and info.size == len(whole)
    assert list(target.uploads.list_uploads("staging/")) == []


def test_a_part_sent_from_several_buffers_is_their_bytes_back_to_back(target: Target) -> None:
    """The agent sends a part of several chunks from the chunks' own buffers, never joined."""
    chunks = [os.urandom(PART), os.urandom(PART), os.urandom(300)]
    part = b"".join(chunks)
    upload_id = target.uploads.create_upload("k")
    etag = target.uploads.upload_part("k", upload_id, 1, [memoryview(bytearray(c)) for c in chunks], crc(part))
    (listed,) = list(target.uploads.list_parts("k", upload_id))
    assert (listed.number, listed.size, listed.etag) == (1, len(part), etag)
    target.uploads.complete_upload("k", upload_id, [SentPart(1, etag, crc(part))], crc(part), len(part))
    assert target.store.get("k") == part


def test_list_parts_reports_what_was_sent(target: Target) -> None:
    first, second = os.urandom(PART), os.urandom(PART * 2)
    upload_id = target.uploads.create_upload("k")
    sent = [send(target, "k", upload_id, 1, first), send(target, "k", upload_id, 2, second)]
    listed = list(target.uploads.list_parts("k", upload_id))
    assert [(p.number, p.size, p.etag) for p in listed] == [(1, PART, sent[0].etag), (2, 2 * PART, sent[1].etag)]
    assert [p.checksum for p in listed] in ([None, None], [crc(first), crc(second)])  # S3 reports CRC64NVME; moto none


def test_a_part_sent_again_replaces_the_first(target: Target) -> None:
    upload_id = target.uploads.create_upload("k")
    send(target, "k", upload_id, 1, b"\0" * PART)
    again = send(target, "k", upload_id, 1, b"\1" * PART)
    last = send(target, "k", upload_id, 2, b"tail")
    (part, _) = list(target.uploads.list_parts("k", upload_id))
    assert part.etag == again.etag
    target.uploads.complete_upload("k", upload_id, [again, last], crc(b"\1" * PART + b"tail"), PART + 4)
    assert target.store.get("k") == b"\1" * PART + b"tail"


def test_open_uploads_are_listed_under_their_prefix(target: Target) -> None:
    a1 = target.uploads.create_upload("staging/a/in0/seg00000")
    a2 = target.uploads.create_upload("staging/a/in0/seg00000")  # a duplicate, as a crashed agent leaves
    b = target.uploads.create_upload("staging/b/in0/seg00000")
    under_a = list(target.uploads.list_uploads("staging/a/"))
    assert sorted((u.key, u.upload_id) for u in under_a) == sorted([("staging/a/in0/seg00000", a1), ("staging/a/in0/seg00000", a2)])
    assert {u.upload_id for u in target.uploads.list_uploads("staging/")} == {a1, a2, b}
    assert list(target.uploads.list_uploads("staging/c/")) == []


def test_abort_drops_the_upload_and_is_idempotent(target: Target) -> None:
    upload_id = target.uploads.create_upload("staging/x/in0/seg00000")
    send(target, "staging/x/in0/seg00000", upload_id, 1, os.urandom(PART))
    target.uploads.abort_upload("staging/x/in0/seg00000", upload_id)
    assert list(target.uploads.list_uploads("staging/")) == []
    target.uploads.abort_upload("staging/x/in0/seg00000", upload_id)  # already gone: fine
    with pytest.raises(UploadGoneError, match="seg00000"):
        list(target.uploads.list_parts("staging/x/in0/seg00000", upload_id))
    assert target.store.head("staging/x/in0/seg00000") is None


def test_a_store_never_keeps_a_checksum_the_bytes_do_not_have(target: Target) -> None:
    """S3 refuses a wrong full-object checksum; where a store accepts it (moto), it
    keeps the checksum of what it stored, so the uploader's comparison catches it."""
    data = os.urandom(PART) + b"end"
    wrong = crc(data[:-1])
    upload_id = target.uploads.create_upload("k")
    sent = [send(target, "k", upload_id, 1, data[:PART]), send(target, "k", upload_id, 2, data[PART:])]
    try:
        stored = target.uploads.complete_upload("k", upload_id, sent, wrong, len(data))
    except StorageError:
        assert target.store.head("k") is None
        return
    kept = stored or (target.store.head("k") or pytest.fail("completed but missing")).checksum
    assert kept == stored_checksum(data) != f"crc64nvme:{wrong}"


def test_purge_removes_everything_under_the_prefix_only(target: Target) -> None:
    for key in ("staging/a/session.json", "staging/a/in0/seg00000", "staging/ab", "keep/x"):
        target.store.put(key, key.encode())
    purged = target.uploads.purge_versions("staging/a/")
    assert purged >= 2
    assert [i.key for i in target.store.list("")] == ["keep/x", "staging/ab"]


def test_janitor_aborts_open_uploads_under_its_prefix(target: Target) -> None:
    ours = [target.uploads.create_upload(f"staging/a/in0/seg0000{n}") for n in range(3)]
    other = target.uploads.create_upload("staging/b/in0/seg00000")
    send(target, "staging/a/in0/seg00000", ours[0], 1, os.urandom(PART))
    janitor = MultipartJanitor(target.uploads)
    assert janitor.abort_uploads("staging/a/") == 3
    assert [u.upload_id for u in target.uploads.list_uploads("staging/")] == [other]
    assert janitor.abort_uploads("staging/a/") == 0


# -- what only S3 (moto) has: versions --------------------------------------------


def test_s3_purge_removes_old_versions_and_delete_markers(aws_env: None) -> None:
    with mock_aws():
        client = s3_client(region="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        store = S3Store(client, BUCKET, "repo")
        store.put("staging/a/session.json", b"1")
        store.put("staging/a/session.json", b"2")
        store.delete(["staging/a/session.json"])
        store.put("keep", b"k")
        assert S3Multipart(store).purge_versions("staging/") == 3  # two versions and a delete marker
        left = client.list_object_versions(Bucket=BUCKET)
        assert [v["Key"] for v in left.get("Versions", [])] == ["repo/keep"] and not left.get("DeleteMarkers")


# -- the S3 adapter where moto is not S3 (botocore's Stubber) ----------------------


def stubbed(aws_env: None) -> tuple[S3Multipart, Stubber]:
    client = s3_client(region="us-east-1")
    return S3Multipart(S3Store(client, BUCKET, "repo")), Stubber(client)


def test_s3_no_such_upload_is_upload_gone(aws_env: None) -> None:
    uploads, stub = stubbed(aws_env)
    with stub:
        stub.add_client_error("upload_part", "NoSuchUpload", "gone", http_status_code=404)
        stub.add_client_error("complete_multipart_upload", "NoSuchUpload", "gone", http_status_code=404)
        stub.add_client_error("abort_multipart_upload", "NoSuchUpload", "gone", http_status_code=404)
        with pytest.raises(UploadGoneError, match=r"s3://braid-multipart/repo/k was aborted .* start a new backup"):
            uploads.upload_part("k", "u1", 1, b"data", crc(b"data"))
        with pytest.raises(UploadGoneError):
            uploads.complete_upload("k", "u1", [SentPart(1, '"e"', crc(b"data"))], crc(b"data"), 4)
        uploads.abort_upload("k", "u1")  # gone already: nothing to do
        stub.assert_no_pending_responses()


def test_s3_part_stored_with_another_checksum_is_refused(aws_env: None) -> None:
    uploads, stub = stubbed(aws_env)
    with stub:
        stub.add_response("upload_part", {"ETag": '"e"', "ChecksumCRC64NVME": crc(b"other")})
        with pytest.raises(StorageError, match="part 1 of k with checksum .* run --resume"):
            uploads.upload_part("k", "u1", 1, b"data", crc(b"data"))


def test_s3_multipart_errors_name_the_object_and_permission(aws_env: None) -> None:
    uploads, stub = stubbed(aws_env)
    with stub:
        stub.add_client_error("create_multipart_upload", "AccessDenied", "no", http_status_code=403)
        stub.add_client_error("list_multipart_uploads", "AccessDenied", "no", http_status_code=403)
        with pytest.raises(StorageError, match=r"access denied while starting the upload of s3://braid-multipart/repo/k: the role needs s3:PutObject"):
            uploads.create_upload("k")
        with pytest.raises(StorageError, match="s3:ListBucketMultipartUploads"):
            list(uploads.list_uploads("staging/"))
