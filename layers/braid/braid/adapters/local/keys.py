"""The local key service: a master-key file standing in for KMS.

The file holds a 256-bit master key that wraps each backup's data key with
AES-256-GCM, the encryption context as associated data, exactly as KMS binds
a data key to its context. It lives outside the repository (losing the
repository must not give away the key), is created 0600, and is never
overwritten.
"""

from __future__ import annotations

import base64
import json
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from braid.errors import KeyAccessError
from braid.format.digests import sha256
from braid.format.keys import DATA_KEY_BYTES, DataKey, WrappedKey, canonical_context

KEY_FILE_FORMAT = "braid-master-key"


def _who(mode: int) -> str:
    return " and ".join(who for who, bit in (("its group", 0o040), ("others", 0o004)) if mode & bit)


def _key_id(master: bytes) -> str:
    return "local:" + sha256(b"braid/v1/master-key-id", master).hex()[:24]


class LocalKeyFile:
    """KeyService over a master-key file."""

    def __init__(self, path: Path, master: bytes) -> None:
        self.path = path
        self._master = AESGCM(master)
        self._key_id = _key_id(master)

    @property
    def key_id(self) -> str:
        return self._key_id

    @classmethod
    def create(cls, path: Path) -> LocalKeyFile:
        """Write a new master key; refuses to replace an existing file."""
        master = os.urandom(32)
        doc = {"format": KEY_FILE_FORMAT, "version": 1, "key_id": _key_id(master), "key": base64.b64encode(master).decode()}
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:  # e.g. a service user whose home is /nonexistent
            raise KeyAccessError(
                f"cannot create key file {path}: {exc.strerror or exc} ({exc.filename}); give --key-file PATH or set BRAID_KEY_FILE"
            ) from None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise KeyAccessError(f"key file {path} already exists; refusing to overwrite a master key") from None
        except OSError as exc:
            raise KeyAccessError(f"cannot create key file {path}: {exc.strerror}") from None
        with os.fdopen(fd, "w") as handle:
            json.dump(doc, handle)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        return cls(path, master)

    @classmethod
    def open(cls, path: Path, *, strict: bool = False, warn: Callable[[str], None] | None = None) -> LocalKeyFile:
        """The key in `path`. A file group or others may read is refused with `strict`
        (--strict-permissions), else `warn`ed about (as ssh does for its keys)."""
        try:
            with open(path, "rb") as handle:
                mode = stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
                text = handle.read().decode()
            if mode & 0o044:
                problem = f"key file {path} is readable by {_who(mode)} (mode {mode:04o}); make it private: chmod 600 {path}"
                if strict:
                    raise KeyAccessError(f"{problem} (refused: --strict-permissions)")
                if warn is not None:
                    warn(problem)
            doc = json.loads(text)
            if doc.get("format") != KEY_FILE_FORMAT:
                raise ValueError("not a Braid master key file")
            master = base64.b64decode(doc["key"], validate=True)
            if len(master) != 32 or doc.get("key_id") != _key_id(master):
                raise ValueError("key file is damaged (key id does not match the key)")
        except FileNotFoundError:
            raise KeyAccessError(f"key file {path} not found; give the master-key file's path with --key-file PATH or BRAID_KEY_FILE") from None
        except PermissionError:
            raise KeyAccessError(f"key file {path} is not readable by this user") from None
        except IsADirectoryError:
            raise KeyAccessError(f"key file {path} is a directory; give the master-key file itself (--key-file or BRAID_KEY_FILE)") from None
        except OSError as exc:  # a FIFO's EOF, EIO, ELOOP...: any OS failure is "cannot use this key file"
            raise KeyAccessError(f"key file {path} cannot be read: {exc.strerror or exc}") from None
        except (ValueError, KeyError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
            raise KeyAccessError(f"key file {path} is not a valid Braid master key: {exc}") from None
        return cls(path, master)

    def generate_data_key(self, context: Mapping[str, str]) -> tuple[DataKey, WrappedKey]:
        material = os.urandom(DATA_KEY_BYTES)
        return DataKey(material), self._wrap(material, context)

    def _wrap(self, material: bytes, context: Mapping[str, str]) -> WrappedKey:
        nonce = os.urandom(12)
        ciphertext = nonce + self._master.encrypt(nonce, material, canonical_context(context))
        return WrappedKey(self._key_id, ciphertext, dict(context))

    def rewrapper(self, target: LocalKeyFile) -> LocalRewrap:
        """Re-wraps data keys this file wrapped under `target` (braid rekey --new-key-file)."""
        return LocalRewrap(self, target)

    def _unwrap_material(self, wrapped: WrappedKey) -> bytes:
        backup = wrapped.context.get("braid:backup", "this backup")
        if wrapped.key_id != self._key_id:
            raise KeyAccessError(
                f"{backup} was encrypted under key {wrapped.key_id}, but key file {self.path} holds {self._key_id}: wrong key file"
            )
        try:
            return self._master.decrypt(wrapped.ciphertext[:12], wrapped.ciphertext[12:], canonical_context(wrapped.context))
        except InvalidTag:
            raise KeyAccessError(f"the data key of {backup} does not unwrap under {self.path}: wrong key or altered encryption context") from None

    def unwrap(self, wrapped: WrappedKey) -> DataKey:
        return DataKey(self._unwrap_material(wrapped))

    def unwrap_material(self, wrapped: WrappedKey) -> bytes:
        """The data key's bytes, for wrapping under another repository's key (braid copy, `KeyCopy`)."""
        return self._unwrap_material(wrapped)

    def wrap_material(self, material: bytes, context: Mapping[str, str]) -> WrappedKey:
        """Wrap an existing data key (another repository's backup, copied here) for `context`."""
        return self._wrap(material, context)


class LocalRewrap:
    """KeyRewrapper between two master-key files: unwrap under the old one, wrap under the new (fresh nonce)."""

    def __init__(self, source: LocalKeyFile, target: LocalKeyFile) -> None:
        self._source = source
        self._target = target

    @property
    def target_key_id(self) -> str:
        return self._target.key_id

    def rewrap(self, wrapped: WrappedKey) -> WrappedKey:
        source = self._target if wrapped.key_id == self._target.key_id else self._source
        return self._target._wrap(source._unwrap_material(wrapped), wrapped.context)


class MaterialKeys(Protocol):
    """A key service that hands out and takes a data key's bytes: the master-key file, or KMS Decrypt/Encrypt."""

    @property
    def key_id(self) -> str: ...

    def unwrap_material(self, wrapped: WrappedKey) -> bytes: ...

    def wrap_material(self, material: bytes, context: Mapping[str, str]) -> WrappedKey: ...


class KeyCopy:
    """DataKeyCopier (braid.ports.keys) between two key services: unwrap under the source, wrap under the target.

    Any pair of a master-key file and KMS; between two KMS keys
    braid.adapters.aws.kms.KmsCopy re-encrypts inside KMS instead.
    """

    def __init__(self, source: MaterialKeys, target: MaterialKeys) -> None:
        self._source = source
        self._target = target

    @property
    def target_key_id(self) -> str:
        return self._target.key_id

    def copy_wrapped(self, wrapped: WrappedKey, context: Mapping[str, str]) -> WrappedKey:
        return self._target.wrap_material(self._source.unwrap_material(wrapped), context)
