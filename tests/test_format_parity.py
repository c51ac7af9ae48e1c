"""Format parity: a local and a cloud manifest have one shape (docs/format.md, Manifest).

The local manifest comes from the local engine; the cloud one from the
pipeline's own steps (Prepare, Plan, Worker, Finalize) run in-process over
moto S3 and KMS, staged the way the agent stages. Both are compared as
stored bytes, with checks written from docs/format.md rather than with the
code under test: the sealed layout, recursive key sets, timestamp form,
algorithms descriptor, engine names and checksum spellings.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from braid.adapters.aws.kms import KmsKeyService
from braid.adapters.aws.s3 import S3Store
from braid.adapters.local.keys import LocalKeyFile
from braid.adapters.local.store import LocalStore
from braid.engine.local import LocalEngine
from braid.engine.port import BackupRequest
from braid.engine.stream import InputSource
from braid.format.checksum import crc64nvme, encode_crc64nvme, stored_checksum
from braid.format.ids import BackupRef
from braid.format.layout import chunk_key, manifest_key
from braid.format.repository import Repository, RepositoryConfig
from braid.format.staging import SegmentRecord, SessionRecord, StagingArea, StreamEnd, segment_key
from braid.format.timestamps import utc_now
from braid.pipeline.finalize import finalize_step
from braid.pipeline.plan import plan_next_round
from braid.pipeline.prepare import load_data_key, prepare_backup
from braid.pipeline.worker import ChunkLanes, process_item
from braid.ports.pipeline import PlainStoreJanitor, RecordingPublisher
from braid.ports.store import ObjectStore

CHUNK = 4096
SEGMENT_PARTS = 2
LEVEL = 3
INPUTS = [b"row 1 " * 2000, bytes(range(256)) * 20 + b"tail"]  # 12,000 and 5,124 bytes: 3 and 2 chunks

# docs/format.md, from the text of the spec rather than from braid.format.
TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")
TAGGED_CRC64NVME = re.compile(r"crc64nvme:[A-Za-z0-9+/]{11}=")
SEALED = re.compile(rb'\{"mac":"([0-9a-f]{64})","manifest":(\{.*\}),"sha256":"([0-9a-f]{64})"\}', re.DOTALL)
ENGINE_SPECIFIC = {"timings", "stats"}  # free-form numbers per engine, per the spec


@dataclass(frozen=True)
class Published:
    raw: bytes  # the manifest as stored
    store: ObjectStore
    ref: BackupRef

    @property
    def body(self) -> dict[str, Any]:
        match = SEALED.fullmatch(self.raw)
        assert match is not None, "the stored manifest does not have the sealed layout"
        doc: dict[str, Any] = json.loads(match.group(2))
        return doc


def local_manifest(tmp_path: Path) -> Published:
    keys = LocalKeyFile.create(tmp_path / "master.key")
    (tmp_path / "repo").mkdir()
    store = LocalStore(tmp_path / "repo")
    repository = Repository.create(store, RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, utc_now()))
    sources = []
    for index, data in enumerate(INPUTS):
        path = tmp_path / f"in{index}"
        path.write_bytes(data)
        sources.append(InputSource(index, str(path), str(path)))
    ref = BackupRef.new("db")
    LocalEngine(repository, keys).run(BackupRequest(ref, sources, CHUNK, LEVEL, 2), lambda event: None)
    return Published(store.get(manifest_key(ref)), store, ref)


def stage_like_the_agent(store: ObjectStore, repository_id: str, ref: BackupRef) -> None:
    area = StagingArea(store, ref)
    area.write_session(SessionRecord(str(ref), repository_id, CHUNK, SEGMENT_PARTS, LEVEL, [f"pipe{i}" for i in range(len(INPUTS))], utc_now()))
    segment_bytes = CHUNK * SEGMENT_PARTS
    counts = []
    for input_index, data in enumerate(INPUTS):
        segments = range(0, len(data), segment_bytes)
        counts.append(len(segments))
        for number, offset in enumerate(segments):
            segment = data[offset : offset + segment_bytes]
            key = segment_key(ref, input_index, number)
            store.put(key, segment)
            parts = [encode_crc64nvme(crc64nvme(segment[p : p + CHUNK])) for p in range(0, len(segment), CHUNK)]
            area.write_segment_record(SegmentRecord(input_index, number, key, offset, len(segment), len(parts), stored_checksum(segment), parts))
    area.write_stream_end(StreamEnd([len(d) for d in INPUTS], counts))


def run_pipeline(store: ObjectStore, keys: KmsKeyService, ref: BackupRef, repository_id: str) -> None:
    prepare_backup(store, keys, ref)
    key, _ = load_data_key(store, keys, ref, repository_id)
    lanes = ChunkLanes(2)
    for _ in range(20):
        status = plan_next_round(store, ref, max_concurrency=4, max_chunks_per_item=2, poll_seconds=1, stall_seconds=60)
        if status.status == "done":
            break
        assert status.status == "ready", status
        for item in StagingArea(store, ref).read_rounds()[-1].items:
            process_item(store, ref, item, key=key, level=LEVEL, lanes=lanes)
    else:
        raise AssertionError("the planner never finished")
    finalize_step(store, keys, PlainStoreJanitor(), RecordingPublisher(), ref)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Published, Published]]:
    """One backup of the same inputs per engine, shared by the tests below (moto stays up for them)."""
    local = local_manifest(tmp_path_factory.mktemp("local"))
    with pytest.MonkeyPatch.context() as env, mock_aws():
        # Fake credentials, no endpoint override: moto, never a real account (as conftest's aws_env).
        for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_KMS", "AWS_SESSION_TOKEN"):
            env.delenv(name, raising=False)
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="braid-repo")
        kms = boto3.client("kms", region_name="us-east-1")
        key_arn = kms.create_key()["KeyMetadata"]["Arn"]
        store = S3Store(s3, "braid-repo", "")
        repository = Repository.create(store, RepositoryConfig.new({"type": "kms", "key_id": key_arn}, utc_now()))
        ref = BackupRef.new("db")
        stage_like_the_agent(store, repository.config.id, ref)
        run_pipeline(store, KmsKeyService(kms, key_arn), ref, repository.config.id)
        yield local, Published(store.get(manifest_key(ref)), store, ref)


USAGE_MAPS = ("/usage/requests", "/usage/lambda")


def shape(doc: Any, path: str = "") -> Any:
    """Recursive key sets and JSON types; a list is the union of its elements' shapes."""
    if path in USAGE_MAPS:
        return "map"  # keyed by what was used: a local backup's requests are none, a cloud backup's many
    if isinstance(doc, dict):
        return {key: ("engine-specific" if path == "" and key in ENGINE_SPECIFIC else shape(value, f"{path}/{key}")) for key, value in doc.items()}
    if isinstance(doc, list):
        shapes = {json.dumps(shape(item, path), sort_keys=True) for item in doc}
        return ["list", sorted(shapes)]
    return type(doc).__name__


def test_both_engines_write_one_shape(published: tuple[Published, Published]) -> None:
    local, cloud = published
    assert shape(local.body) == shape(cloud.body)
    for body in (local.body, cloud.body):
        assert (body["format"], body["version"]) == ("braid-manifest", 2)
        for name in ENGINE_SPECIFIC:
            assert body[name] and all(isinstance(v, int | float) and not isinstance(v, bool) for v in body[name].values())
        assert sorted(body["key"]["encryption_context"]) == ["braid:backup", "braid:repository"]
        assert [i["length"] for i in body["inputs"]] == [len(d) for d in INPUTS]
        assert body["totals"] == {
            "inputs": len(INPUTS),
            "chunks": 5,
            "plaintext_bytes": sum(len(d) for d in INPUTS),
            "stored_bytes": sum(c["stored_length"] for i in body["inputs"] for c in i["chunks"]),
        }


def test_engine_names_are_the_documented_ones(published: tuple[Published, Published]) -> None:
    local, cloud = published
    assert (local.body["engine"], cloud.body["engine"]) == ("local", "stepfunctions")


def test_one_timestamp_form(published: tuple[Published, Published]) -> None:
    for body in (p.body for p in published):
        assert TIMESTAMP.fullmatch(body["created"]) and TIMESTAMP.fullmatch(body["completed"])
        assert body["created"] <= body["completed"]


def test_one_algorithms_descriptor(published: tuple[Published, Published]) -> None:
    local, cloud = published
    assert local.body["algorithms"] == cloud.body["algorithms"]
    assert local.body["algorithms"]["level"] == LEVEL and local.body["algorithms"]["stored_checksum"] == "crc64nvme"


def test_checksums_are_spelled_one_way_and_name_the_stored_bytes(published: tuple[Published, Published]) -> None:
    for manifest in published:
        for entry in (c for i in manifest.body["inputs"] for c in i["chunks"]):
            assert TAGGED_CRC64NVME.fullmatch(entry["checksum"]), entry["checksum"]
            # docs/format.md, Packs: the frame is `stored_length` bytes at `pack_offset` of the object keyed by chunk `pack`.
            start = entry["pack_offset"]
            stored = manifest.store.get(chunk_key(manifest.ref, entry["pack"]))[start : start + entry["stored_length"]]
            value = int.from_bytes(base64.b64decode(entry["checksum"].partition(":")[2]), "big")
            assert value == crc64nvme(stored) and len(stored) == entry["stored_length"]
            assert re.fullmatch(r"[0-9a-f]{32}", entry["mac"]) and entry["compression"] in ("zstd", "none")
        assert all(re.fullmatch(r"[0-9a-f]{64}", i["mac"]) for i in manifest.body["inputs"])


def test_packs_are_frames_back_to_back_keyed_by_their_first_chunk(published: tuple[Published, Published]) -> None:
    """docs/format.md, Packs: each object under data/NAME/ID/ is its chunks' frames in order and nothing else;
    the local engine stores every chunk alone, the cloud worker runs of up to CHUNKS_PER_PACK chunks of an item, as even as
    possible (braid.pipeline.worker.pack_sizes: an item of 2 chunks is one pack of two)."""
    local, cloud = published
    for manifest in published:
        chunks = sorted((c for i in manifest.body["inputs"] for c in i["chunks"]), key=lambda c: c["index"])
        packs: dict[int, list[dict[str, Any]]] = {}
        for entry in chunks:
            packs.setdefault(entry["pack"], []).append(entry)
        for first, frames in packs.items():
            assert frames[0]["index"] == first and [f["index"] for f in frames] == list(range(first, first + len(frames)))
            assert [f["pack_offset"] for f in frames] == [sum(f["stored_length"] for f in frames[:n]) for n in range(len(frames))]
            assert len(manifest.store.get(chunk_key(manifest.ref, first))) == sum(f["stored_length"] for f in frames)
        listed = {info.key for info in manifest.store.list(f"data/{manifest.ref.name}/{manifest.ref.id}/")}
        assert listed == {chunk_key(manifest.ref, first) for first in packs}
        sizes = sorted(len(frames) for frames in packs.values())
        # local: every chunk alone; cloud: items of 2, 1 and 2 chunks, each one pack (two of them of two frames)
        assert sizes == ([1] * 5 if manifest is local else [1, 2, 2])
