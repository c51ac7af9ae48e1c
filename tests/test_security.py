"""Security properties, checked on what is really stored and really printed (local repository).

- No plaintext in any stored object: a planted marker (32 random bytes,
  repeated through the input, in a compressible part and in an
  incompressible part that is stored without compression) appears in no
  file of the repository, leftovers of a killed backup and the key's own
  files included.
- Nonces never repeat within a backup (nor across the repository): every
  chunk's header is parsed (braid.format.chunk.ChunkHeader.unpack).
- Key material never reaches output: the data key, its derived encryption
  key and the master key, raw, base64 or hex, appear in no stdout or stderr
  of the CLI, with --debug, on success and on a failure that prints a
  traceback.

The cloud side (object versions in the bucket, the pipeline's Powertools
logs) is in tests/cloud/test_cloud_faults.py, on the emulator those tests
already run.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from braid.adapters.local.store import LocalStore
from braid.format.chunk import ChunkHeader
from braid.format.ids import BackupRef
from braid.format.keys import DataKey, canonical_context
from braid.format.repository import Repository
from support.kill_points import CHUNK, LocalRepo, Tally, kill_backup

pytestmark = pytest.mark.e2e
MiB = 1024**2


def marked_input(marker: bytes, size: int, seed: int) -> bytes:
    """Half the marker repeated with short rows between (compresses), half random bytes with
    the marker every 4 KiB (does not, so those chunks are stored uncompressed)."""
    import random

    rng = random.Random(seed)
    half = size // 2
    rows = b"".join(marker + f" row {i};".encode() for i in range(half // (len(marker) + 10) + 1))[:half]
    noisy = bytearray(rng.randbytes(size - half))
    for at in range(0, len(noisy) - len(marker), 4096):
        noisy[at : at + len(marker)] = marker
    return rows + bytes(noisy)


def forms(secret: bytes) -> list[bytes]:
    """How a key could leak into text: raw, hex (both cases), base64 (both alphabets, with or without padding)."""
    b64 = base64.b64encode(secret)
    return [secret, secret.hex().encode(), secret.hex().upper().encode(), b64, b64.rstrip(b"="), base64.urlsafe_b64encode(secret).rstrip(b"=")]


def leaked(secrets: dict[str, bytes], text: bytes) -> list[str]:
    return [f"{name} ({form[:12]!r}...)" for name, secret in secrets.items() for form in forms(secret) if form in text]


def stored_files(repo: LocalRepo) -> dict[str, bytes]:
    return {str(p.relative_to(repo.path)): p.read_bytes() for p in repo.path.rglob("*") if p.is_file()}


def key_material(repo: LocalRepo, ref: str) -> dict[str, bytes]:
    """The backup's data key (unwrapped here with the master key, as LocalKeyFile does) and the master key."""
    (key_file,) = (repo.root / "config" / "braid" / "keys").iterdir()
    master = base64.b64decode(json.loads(key_file.read_text())["key"])
    wrapped = Repository.open(LocalStore(repo.path)).load(BackupRef.parse(ref)).manifest.key
    material = AESGCM(master).decrypt(wrapped.ciphertext[:12], wrapped.ciphertext[12:], canonical_context(wrapped.context))
    return {"data key": material, "chunk encryption key": DataKey(material).encryption_key, "master key": master}


def test_no_stored_byte_holds_the_plaintext_even_in_a_killed_backups_leftovers(tmp_path: Path) -> None:
    repo = LocalRepo(tmp_path / "marker")
    marker = os.urandom(32)
    data = marked_input(marker, 3 * MiB, 1)
    assert data.count(marker) > 1000
    ref = repo.backup("db", data)
    killed = kill_backup(repo, "db", marked_input(marker, 2 * MiB, 2), ("chunks", 3), {}, Tally())

    files = stored_files(repo)

    assert killed and any(name.startswith("data/db/") and name.rsplit("/", 1)[1].isdigit() for name in files)
    assert sum(1 for name in files if name.startswith(f"data/db/{ref.partition('@')[2]}/")) == -(-len(data) // CHUNK)
    carrying = sorted(name for name, content in files.items() if marker in content or marker[:16] in content or marker[16:] in content)
    assert carrying == [], f"plaintext found in {carrying}"
    restored = tmp_path / "restored.bin"
    assert repo.check("restore", ref, "--output", str(restored)).code == 0
    assert restored.read_bytes() == data  # the marker went in, and comes back out


def test_nonces_never_repeat_within_a_backup_nor_across_the_repository(tmp_path: Path) -> None:
    repo = LocalRepo(tmp_path / "nonces")
    same = os.urandom(CHUNK) * 64  # identical chunks: the same plaintext must still get fresh nonces
    refs = [repo.backup("db", same), repo.backup("db", same), repo.backup("other", os.urandom(3 * MiB))]

    nonces: dict[bytes, str] = {}
    per_backup: dict[str, int] = {}
    for path in sorted((repo.path / "data").rglob("*")):
        if not (path.is_file() and path.name.isdigit()):
            continue
        name, backup_id = path.parts[-3], path.parts[-2]
        header, _ = ChunkHeader.unpack(path.read_bytes(), str(path))
        assert (header.backup, header.index) == (f"{name}@{backup_id}", int(path.name))
        assert header.nonce not in nonces, f"nonce of {path} repeats that of {nonces.get(header.nonce)}"
        nonces[header.nonce] = str(path)
        per_backup[header.backup] = per_backup.get(header.backup, 0) + 1

    assert per_backup == {refs[0]: 64, refs[1]: 64, refs[2]: 48}


def test_no_key_material_in_any_output_with_debug_on_success_or_failure(tmp_path: Path) -> None:
    repo = LocalRepo(tmp_path / "keys")
    data = os.urandom(1 * MiB)
    backed_up = repo.run("backup", "--name", "db", "--chunk-size", "64KiB", "--debug", "--json", stdin=data)
    assert backed_up.code == 0, backed_up.stderr
    ref = json.loads(backed_up.stdout)["backup"]  # --json: the summary document
    secrets = key_material(repo, ref)
    restored = repo.run("restore", ref, "--debug", "--json")
    assert (restored.code, restored.stdout) == (0, data)
    # A failure with a traceback: one chunk flipped, restore and verify --deep report it.
    chunk = repo.path / "data" / "db" / ref.partition("@")[2] / "0000000005"
    stored = bytearray(chunk.read_bytes())
    stored[-20] ^= 0x01
    chunk.write_bytes(stored)
    failed_restore = repo.run("restore", ref, "--debug", "--output", str(tmp_path / "out.bin"))
    failed_verify = repo.run("verify", ref, "--deep", "--debug")

    assert failed_restore.code == 6 and "Traceback" in failed_restore.stderr, failed_restore.stderr
    assert failed_restore.error.startswith(f"braid: error: chunk 5 of backup {ref}: failed authentication (corrupt, tampered, or a different key);")
    assert failed_restore.error.endswith(f"check the backup with 'braid verify --deep {ref}', and restore an older one (braid list --name {ref.partition('@')[0]})")
    assert failed_verify.code == 6 and "Traceback" in failed_verify.stderr
    assert failed_verify.error.startswith("braid: error: 1 of 1 backup(s) failed verification; first: chunk 5"), failed_verify.error
    outputs = {
        "backup": backed_up.stdout + backed_up.stderr.encode(),
        "restore": restored.stderr.encode(),
        "failed restore": failed_restore.stdout + failed_restore.stderr.encode(),
        "failed verify": failed_verify.stdout + failed_verify.stderr.encode(),
    }
    assert leaked(secrets, b"x" + secrets["data key"].hex().encode()) == [f"data key ({secrets['data key'].hex().encode()[:12]!r}...)"]
    found = {command: leaked(secrets, text) for command, text in outputs.items() if leaked(secrets, text)}
    assert found == {}
    carrying = {name: leaked(secrets, content) for name, content in stored_files(repo).items() if leaked(secrets, content)}
    assert carrying == {}, "key material stored in the repository"
