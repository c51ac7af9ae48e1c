"""One set of KeyService tests for the local key file and KMS (moto)."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber
from moto import mock_aws

from braid.adapters.aws.clients import kms_client
from braid.adapters.aws.kms import KmsKeyService
from braid.adapters.local import keys as local_keys
from braid.adapters.local.keys import LocalKeyFile
from braid.errors import KeyAccessError
from braid.format.keys import WrappedKey, encryption_context
from braid.ports.keys import KeyService

CONTEXT = encryption_context("repo-1", "db@20261123T010203Z-1a2b3c4d")


@dataclass
class Keys:
    """A key service, a factory for an unrelated one, and every data key it handed out."""

    service: KeyService
    another: Callable[[], KeyService]
    materials: list[bytes] = field(default_factory=list)


@pytest.fixture(params=["local", "kms"])
def keys(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Keys]:
    if request.param == "local":
        materials: list[bytes] = []
        real_urandom = os.urandom

        def recording_urandom(n: int) -> bytes:
            value = real_urandom(n)
            if n == 32:
                materials.append(value)
            return value

        service = LocalKeyFile.create(tmp_path / "master.key")
        monkeypatch.setattr(local_keys.os, "urandom", recording_urandom)
        yield Keys(service, lambda: LocalKeyFile.create(tmp_path / "other.key"), materials)
        return
    request.getfixturevalue("aws_env")
    with mock_aws():
        client = kms_client(region="us-east-1")
        key_arn = client.create_key(Description="braid test")["KeyMetadata"]["Arn"]
        result = Keys(KmsKeyService(client, key_arn), lambda: KmsKeyService(client, client.create_key()["KeyMetadata"]["Arn"]))

        def capture(parsed: dict[str, Any], **_: Any) -> None:
            if "Plaintext" in parsed:
                result.materials.append(bytes(parsed["Plaintext"]))

        client.meta.events.register("after-call.kms.GenerateDataKey", capture)
        yield result


def test_round_trip(keys: Keys) -> None:
    data_key, wrapped = keys.service.generate_data_key(CONTEXT)
    assert wrapped.context == CONTEXT
    assert wrapped.key_id and wrapped.ciphertext
    again = keys.service.unwrap(wrapped)
    assert again.fingerprint == data_key.fingerprint
    assert again.encryption_key == data_key.encryption_key
    other_key, other_wrapped = keys.service.generate_data_key(CONTEXT)
    assert other_key.fingerprint != data_key.fingerprint  # a fresh key per backup


def test_wrapped_key_survives_json(keys: Keys) -> None:
    data_key, wrapped = keys.service.generate_data_key(CONTEXT)
    restored = WrappedKey.from_json(wrapped.to_json())
    assert keys.service.unwrap(restored).fingerprint == data_key.fingerprint


def test_wrong_context_is_refused(keys: Keys) -> None:
    _, wrapped = keys.service.generate_data_key(CONTEXT)
    moved = WrappedKey(wrapped.key_id, wrapped.ciphertext, encryption_context("repo-1", "db@20261123T010203Z-ffffffff"))
    with pytest.raises(KeyAccessError, match="db@20261123T010203Z-ffffffff"):
        keys.service.unwrap(moved)


def test_altered_ciphertext_is_refused(keys: Keys) -> None:
    _, wrapped = keys.service.generate_data_key(CONTEXT)
    flipped = bytearray(wrapped.ciphertext)
    flipped[-1] ^= 1
    with pytest.raises(KeyAccessError, match=CONTEXT["braid:backup"]):
        keys.service.unwrap(WrappedKey(wrapped.key_id, bytes(flipped), wrapped.context))


def test_key_from_another_master_key_is_refused(keys: Keys) -> None:
    other = keys.another()
    _, wrapped = other.generate_data_key(CONTEXT)
    with pytest.raises(KeyAccessError, match=CONTEXT["braid:backup"]):
        keys.service.unwrap(wrapped)
    # And a wrapped key that claims to be ours but is not.
    with pytest.raises(KeyAccessError):
        keys.service.unwrap(WrappedKey(keys.service.key_id, wrapped.ciphertext, wrapped.context))


def test_data_key_never_shown(keys: Keys) -> None:
    data_key, wrapped = keys.service.generate_data_key(CONTEXT)
    assert len(keys.materials) == 1
    material = keys.materials[0]
    forms = [material.hex(), base64.b64encode(material).decode(), repr(material)[2:-1]]
    shown = [repr(data_key), str(data_key), repr(wrapped), repr(keys.service), str(wrapped.to_json())]
    try:
        keys.service.unwrap(WrappedKey(wrapped.key_id, wrapped.ciphertext, {"braid:backup": "x@y"}))
    except KeyAccessError as exc:
        shown.append(str(exc))
    for text in shown:
        for form in forms:
            assert form not in text
    assert repr(data_key) == f"DataKey(fingerprint={data_key.fingerprint})"


def test_kms_unwrap_only_service(aws_env: None) -> None:
    """Workers and restore hold kms:Decrypt only: the key id comes from the backup."""
    with mock_aws():
        client = kms_client(region="us-east-1")
        key_arn = client.create_key()["KeyMetadata"]["Arn"]
        data_key, wrapped = KmsKeyService(client, key_arn).generate_data_key(CONTEXT)
        assert wrapped.key_id == key_arn
        unwrap_only = KmsKeyService.for_unwrap(client)
        assert unwrap_only.unwrap(wrapped).fingerprint == data_key.fingerprint
        with pytest.raises(KeyAccessError, match="only unwraps"):
            unwrap_only.generate_data_key(CONTEXT)


def test_kms_missing_key_names_the_fix(aws_env: None) -> None:
    with mock_aws():
        client = kms_client(region="us-east-1")
        service = KmsKeyService(client, "arn:aws:kms:us-east-1:123456789012:key/00000000-0000-0000-0000-000000000000")
        with pytest.raises(KeyAccessError, match="not found.*region"):
            service.generate_data_key(CONTEXT)

    # moto generates data keys under a disabled key (a gap); KMS answers
    # DisabledException, injected here with botocore's Stubber.
    client = kms_client(region="us-east-1")
    with Stubber(client) as stub:
        stub.add_client_error("generate_data_key", "DisabledException", "key is disabled")
        stub.add_client_error("decrypt", "IncorrectKeyException", "wrong key")
        stub.add_client_error("decrypt", "AccessDeniedException", "denied", http_status_code=400)
        service = KmsKeyService(client, "alias/braid")
        with pytest.raises(KeyAccessError, match="disabled.*re-enable"):
            service.generate_data_key(CONTEXT)
        wrapped = WrappedKey("arn:aws:kms:us-east-1:123456789012:key/other", b"blob", CONTEXT)
        with pytest.raises(KeyAccessError, match="encrypted under KMS key arn:.*key/other"):
            service.unwrap(wrapped)
        with pytest.raises(KeyAccessError, match="grant kms:Decrypt"):
            service.unwrap(wrapped)
