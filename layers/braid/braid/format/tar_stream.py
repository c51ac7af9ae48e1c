"""An incremental tar parser for a stream that arrives in pieces of any size.

The stdlib's `tarfile` wants a file object it can read (and, for most
modes, seek) at its own pace; a backup stream here is a sequence of chunk
buffers handed over one by one by the driver loop (braid.engine.driver) or
by restore's decoders, each given back once the next step took it. This
parser is pushed instead: `feed(piece)` takes any slice of the stream, keeps
at most one 512-byte header block (and a pax or GNU long-name record, at
most `MAX_EXTENDED` bytes) of its own, and hands each member's bytes to the
consumer its `open_member` callback returned for it, as slices of the
pieces fed. So it costs O(members), not O(bytes), and holds no chunk.

It reads what pg_basebackup -Ft writes (ustar) and what GNU and pax tar
write: pax `x` records (path, linkpath, size), pax `g` records (ignored),
GNU `L`/`K` long names, base-256 sizes, the ustar prefix field, and the
end-of-archive blocks (anything after them is ignored, as tar does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

BLOCK = 512
MAX_EXTENDED = 1 << 20  # a pax or GNU long-name record larger than this is not a tar we read

REGULAR = "0"
DIRECTORY = "5"
SYMLINK = "2"
HARDLINK = "1"


class TarFormatError(ValueError):
    """The bytes are not a tar this parser reads (a bad header checksum, a truncated member...)."""


@dataclass(frozen=True)
class TarMember:
    name: str
    kind: str  # the typeflag: REGULAR, DIRECTORY, SYMLINK, HARDLINK or another
    size: int
    mode: int
    mtime: int
    linkname: str
    offset: int  # where its data starts in the stream


class MemberConsumer(Protocol):
    def write(self, data: memoryview) -> None:
        """The member's next bytes, in order; `data` is valid only during the call."""
        ...

    def close(self) -> None:
        """Every byte of the member was written."""
        ...


OpenMember = Callable[[TarMember], MemberConsumer | None]


def _octal(field: bytes, what: str) -> int:
    if field and field[0] & 0x80:  # GNU base-256, for sizes of 8 GiB and more
        value = field[0] & 0x3F
        for byte in field[1:]:
            value = (value << 8) | byte
        return value
    text = field.split(b"\0", 1)[0].strip(b" \0")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise TarFormatError(f"tar header field {what} is not octal: {text[:20]!r}") from None


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


_HIGH = bytes(range(128, 256))
_ZERO_BLOCK = bytes(BLOCK)


def header_checksum_ok(block: bytes | memoryview) -> bool:
    """Whether a 512-byte block is a tar header: its checksum field matches (signed or unsigned sums, as tar accepts)."""
    raw = bytes(block)
    try:
        stored = int(raw[148:156].split(b"\0", 1)[0].strip(b" \0") or b"-1", 8)
    except ValueError:
        return False
    rest = raw[:148] + raw[156:]
    unsigned = sum(rest) + 8 * 32
    if stored == unsigned:
        return True
    high = len(rest) - len(rest.translate(None, _HIGH))  # bytes >= 128, negative in a signed sum
    return stored == unsigned - 256 * high


def looks_like_tar(start: bytes | memoryview) -> bool:
    """Whether a stream starting with `start` (its first 512 bytes at least) is a tar archive."""
    return len(start) >= BLOCK and any(start[:100]) and header_checksum_ok(start[:BLOCK])


def _pax_records(data: bytes) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError:
            raise TarFormatError("malformed pax extended header") from None
        if length <= 0 or pos + length > len(data):
            raise TarFormatError("malformed pax extended header")
        record = data[space + 1 : pos + length - 1]  # without the trailing newline
        key, _, value = record.partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


class TarStream:
    """Push-parse a tar stream: `feed` its bytes in order, then `end()`."""

    def __init__(self, open_member: OpenMember) -> None:
        self._open_member = open_member
        self._header = bytearray()
        self._position = 0  # stream bytes consumed
        self._remaining = 0  # of the current member's data (or extended record)
        self._padding = 0
        self._consumer: MemberConsumer | None = None
        self._extended: bytearray | None = None  # collecting a pax / GNU record
        self._extended_kind = ""
        self._pending: dict[str, str] = {}  # overrides for the next member (pax x, GNU L/K)
        self._zero_blocks = 0
        self.ended = False  # the end-of-archive blocks were seen
        self.members = 0

    def feed(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
        while len(view) and not self.ended:
            if self._remaining:
                take = min(self._remaining, len(view))
                piece = view[:take]
                if self._consumer is not None:
                    self._consumer.write(piece)
                elif self._extended is not None:
                    self._extended += piece
                self._remaining -= take
                self._position += take
                view = view[take:]
                if not self._remaining:
                    self._member_done()
                continue
            if self._padding:
                take = min(self._padding, len(view))
                self._padding -= take
                self._position += take
                view = view[take:]
                continue
            take = min(BLOCK - len(self._header), len(view))
            self._header += view[:take]
            self._position += take
            view = view[take:]
            if len(self._header) == BLOCK:
                block = bytes(self._header)
                self._header.clear()
                self._header_block(block)

    def end(self) -> None:
        """The stream ended: it must not end inside a member (a truncated archive)."""
        if self._remaining or self._header or self._padding:
            raise TarFormatError(f"the tar stream ends inside a member, at byte {self._position}")
        if self._consumer is not None:
            raise TarFormatError("the tar stream ends inside a member")

    def _header_block(self, block: bytes) -> None:
        if block == _ZERO_BLOCK:
            self._zero_blocks += 1
            if self._zero_blocks == 2:
                self.ended = True
            return
        if self._zero_blocks:
            raise TarFormatError(f"a zero block inside the tar stream at byte {self._position - 2 * BLOCK}")
        if not header_checksum_ok(block):
            raise TarFormatError(f"bad tar header checksum at byte {self._position - BLOCK}")
        kind = chr(block[156]) if block[156] else REGULAR
        size = _octal(block[124:136], "size")
        if kind in ("x", "g", "L", "K"):
            if size > MAX_EXTENDED:
                raise TarFormatError(f"a {size}-byte extended tar header at byte {self._position - BLOCK}")
            self._extended = bytearray()
            self._extended_kind = kind
            self._start_data(size)
            return
        name = _text(block[0:100])
        if block[257:262] == b"ustar" and block[345]:
            name = _text(block[345:500]) + "/" + name
        linkname = _text(block[157:257])
        name = self._pending.pop("path", name)
        linkname = self._pending.pop("linkpath", linkname)
        if "size" in self._pending:
            size = int(self._pending.pop("size"))
        self._pending.clear()
        member = TarMember(
            name=name,
            kind=kind,
            size=size if kind not in (DIRECTORY, SYMLINK, HARDLINK) else 0,
            mode=_octal(block[100:108], "mode"),
            mtime=_octal(block[136:148], "mtime"),
            linkname=linkname,
            offset=self._position,
        )
        self.members += 1
        self._consumer = self._open_member(member)
        self._start_data(member.size)

    def _start_data(self, size: int) -> None:
        self._remaining = size
        self._padding = -size % BLOCK
        if not size:
            self._member_done()

    def _member_done(self) -> None:
        if self._extended is not None:
            data, kind = bytes(self._extended), self._extended_kind
            self._extended = None
            if kind == "x":
                self._pending.update({k: v for k, v in _pax_records(data).items() if k in ("path", "linkpath", "size")})
            elif kind == "L":
                self._pending["path"] = _text(data)
            elif kind == "K":
                self._pending["linkpath"] = _text(data)
            return
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
