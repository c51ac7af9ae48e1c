"""HTTP/1.1 on a socket for the light AWS clients: what they used of http.client, without its imports.

`import http.client` loads the email package (its header parser, ~0.02
CPU-s) and ssl (~0.01) into every agent; this module loads neither (ssl
only when a caller connects over https: its context comes from
braid.adapters.aws.light_http). It keeps http.client's rules for what it
does: the request head byte for byte (`METHOD path HTTP/1.1`, the
caller's headers in order, names ASCII and values Latin-1, with the same
refusals of control characters), TCP_NODELAY, SNI, and the answer's framing
(1xx answers skipped; chunked, else Content-Length, else to the close; no
body for HEAD, 204, 304 and 1xx; keep-alive per version and `Connection`;
at most 100 header lines of at most 65536 bytes). A reply it cannot read,
and one cut short, is a ProtocolError, a ConnectionError (so an OSError,
as the transport's retries expect): where http.client raised
RemoteDisconnected, BadStatusLine or IncompleteRead.
"""

from __future__ import annotations

import errno
import socket
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ssl
    from collections.abc import Mapping

MAX_LINE = 65536  # http.client._MAXLINE
MAX_HEADERS = 100  # http.client._MAXHEADERS
_NO_BODY = (204, 304)
# struct tcp_info (linux/tcp.h): tcpi_rtt, the smoothed RTT in microseconds (u32), after 8 one-byte fields and 15 u32s
_TCPI_RTT = slice(68, 72)
TCP_WMEM = "/proc/sys/net/ipv4/tcp_wmem"  # min, default and max of a TCP socket's send buffer (Linux ip-sysctl: tcp_wmem)


class ProtocolError(ConnectionError):
    """The server's answer is not HTTP/1.x, breaks its limits, or ends before its body does."""


def address_host(host: str) -> str | bytes:
    """`host` for getaddrinfo: ASCII bytes where the idna codec would give the same bytes (so encodings.idna, with
    stringprep and unicodedata, stays unloaded), else the name itself for the codec to encode or refuse as it does."""
    if not host.isascii():
        return host
    labels = host.encode("ascii").split(b".")
    if all(0 < len(label) < 64 for label in labels[:-1]) and len(labels[-1]) < 64:
        return host.encode("ascii")
    return host


def request_head(method: str, path: str, headers: Mapping[str, str | int]) -> bytes:
    """The request line and header block as http.client's putrequest/putheader/endheaders write them."""
    if any(ord(c) <= 0x20 or c == "\x7f" for c in method + path):
        raise ValueError(f"can't send a request with control characters or spaces: {method!r} {path!r}")
    lines = [f"{method} {path} HTTP/1.1".encode("ascii")]
    for name, value in headers.items():
        raw_name = name.encode("ascii")
        if not raw_name or raw_name[:1] in b": \t\r\n\x0b\x0c" or any(c in raw_name for c in b":\r\n"):
            raise ValueError(f"Invalid header name {raw_name!r}")
        raw = str(value).encode("ascii") if isinstance(value, int) else value.encode("latin-1")
        if (b"\r" in raw or b"\n" in raw) and _illegal_value(raw):
            raise ValueError(f"Invalid header value {raw!r}")
        lines.append(raw_name + b": " + raw)
    lines += (b"", b"")
    return b"\r\n".join(lines)


def _illegal_value(raw: bytes) -> bool:
    import re  # loaded by every agent anyway; compiled only for a value with a line break

    return re.search(rb"\n(?![ \t])|\r(?![ \t\n])", raw) is not None


class Answer:
    """One response: status, headers in the order received, and its body, read whole or as a stream."""

    def __init__(self, sock: socket.socket, method: str) -> None:
        self._fp: Any = sock.makefile("rb")
        try:
            while True:
                version, self.status = self._status_line()
                head = self._header_lines()
                if self.status != 100:
                    break
        except BaseException:
            self.close()
            raise
        self.headers = _parse_headers(head)
        first: dict[str, str] = {}
        for name, value in self.headers:
            first.setdefault(name.lower(), value)  # email.message.Message.get: the first of a name
        self.chunked = first.get("transfer-encoding", "").lower() == "chunked"
        self._chunk_left: int | None = None
        self.will_close = _will_close(version, first)
        self.length: int | None = None
        if first.get("content-length") and not self.chunked:
            try:
                self.length = int(first["content-length"])
            except ValueError:
                pass
            else:
                if self.length < 0:
                    self.length = None
        if self.status in _NO_BODY or 100 <= self.status < 200 or method == "HEAD":
            self.length = 0
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True

    def _line(self, what: str) -> bytes:
        line: bytes = self._fp.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise ProtocolError(f"got more than {MAX_LINE} bytes in a {what}")
        return line

    def _status_line(self) -> tuple[str, int]:
        line = str(self._line("status line"), "iso-8859-1")
        if not line:
            raise ProtocolError("Remote end closed connection without response")
        words = line.split(None, 2)
        version = words[0] if len(words) >= 2 else ""
        try:
            status = int(words[1]) if version.startswith("HTTP/") else 0
        except ValueError:
            status = 0
        if not 100 <= status <= 999:
            raise ProtocolError(f"not an HTTP status line: {line!r}")
        if version not in ("HTTP/1.0", "HTTP/0.9") and not version.startswith("HTTP/1."):
            raise ProtocolError(f"unknown protocol {version!r}")
        return version, status

    def _header_lines(self) -> list[bytes]:
        lines = []
        while True:
            line = self._line("header line")
            lines.append(line)
            if len(lines) > MAX_HEADERS:
                raise ProtocolError(f"got more than {MAX_HEADERS} headers")
            if line in (b"\r\n", b"\n", b""):
                return lines

    def getheaders(self) -> list[tuple[str, str]]:
        return list(self.headers)

    # -- the body ------------------------------------------------------------------------------------

    def read(self, amt: int | None = None) -> bytes:
        """All of the body (amt None), or at most `amt` bytes of it; b"" at its end."""
        if self._fp is None:
            return b""
        if self.chunked:
            return self._read_chunked(amt)
        if amt is None:
            if self.length is None:
                data: bytes = self._fp.read()
            else:
                data = self._exactly(self.length)
                self.length = 0
            self._close_fp()
            return data
        if self.length is not None and amt > self.length:
            amt = self.length
        data = self._fp.read(amt)
        self._count(len(data), amt)
        return data

    def readinto(self, buffer: Any) -> int:
        """Reads into `buffer` (at most the body's rest); 0 at its end."""
        if self._fp is None:
            return 0
        if self.chunked:
            data = self._read_chunked(len(buffer))
            memoryview(buffer)[: len(data)] = data
            return len(data)
        if self.length is not None and len(buffer) > self.length:
            buffer = memoryview(buffer)[: self.length]  # as http.client: the caller's buffer itself, never a copy
        n: int = self._fp.readinto(buffer)
        self._count(n, len(buffer))
        return n

    def _count(self, n: int, asked: int) -> None:
        if not n and asked:
            self._close_fp()
        elif self.length is not None:
            self.length -= n
            if not self.length:
                self._close_fp()

    def _exactly(self, n: int) -> bytes:
        data: bytes = self._fp.read(n)
        if len(data) < n:
            raise ProtocolError(f"IncompleteRead({len(data)} bytes read, {n - len(data)} more expected)")
        return data

    def _read_chunked(self, amt: int | None) -> bytes:
        parts = []
        while amt is None or amt > 0:
            if self._chunk_left is None:
                line = self._line("chunk size")
                try:
                    self._chunk_left = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    self.close()
                    raise ProtocolError(f"bad chunk size {line!r}") from None
                if self._chunk_left == 0:
                    while self._line("trailer line") not in (b"\r\n", b"\n", b""):
                        pass
                    self._close_fp()
                    break
            take = self._chunk_left if amt is None else min(amt, self._chunk_left)
            parts.append(self._exactly(take))
            self._chunk_left -= take
            if amt is not None:
                amt -= take
            if not self._chunk_left:
                self._exactly(2)  # the chunk's CRLF
                self._chunk_left = None
        return b"".join(parts)

    def _close_fp(self) -> None:
        fp, self._fp = self._fp, None
        if fp is not None:
            fp.close()

    def close(self) -> None:
        self._close_fp()


def _parse_headers(lines: list[bytes]) -> list[tuple[str, str]]:
    """`Name: value` pairs as email's compat32 parser gives them to http.client: the value's leading blanks
    dropped, a folded line kept with its line breaks, the last line break dropped."""
    headers: list[list[str]] = []
    for raw in lines:
        line = raw.decode("iso-8859-1")
        if line in ("\r\n", "\n", ""):
            break
        if line[:1] in (" ", "\t"):
            if headers:
                headers[-1][1] += line
            continue
        name, colon, value = line.partition(":")
        if colon:
            headers.append([name, value.lstrip(" \t")])
    return [(name, value.rstrip("\r\n")) for name, value in headers]


def _will_close(version: str, first: dict[str, str]) -> bool:
    """http.client.HTTPResponse._check_close: HTTP/1.1 stays open unless `Connection: close`; 1.0 closes unless kept alive."""
    connection = first.get("connection", "").lower()
    if version not in ("HTTP/1.0", "HTTP/0.9"):
        return "close" in connection
    if first.get("keep-alive") or "keep-alive" in connection:
        return False
    return "keep-alive" not in first.get("proxy-connection", "").lower()


class Connection:
    """One HTTP/1.1 connection to `host`; over TLS when given a context (the server's name sent and checked)."""

    def __init__(self, host: str, port: int | None, timeout: float, context: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.port = port if port is not None else (443 if context is not None else 80)
        self.timeout = timeout
        self.context = context
        self.sock: socket.socket | None = None

    def connect(self) -> None:
        """TimeoutError or another OSError when the server cannot be reached (the TLS handshake included)."""
        address = (address_host(self.host), self.port)  # getaddrinfo takes bytes as well
        sock = socket.create_connection(address, self.timeout)  # type: ignore[arg-type]
        try:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as exc:
                if exc.errno != errno.ENOPROTOOPT:
                    raise
            if self.context is not None:
                sock = self.context.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def send_head(self, method: str, path: str, headers: Mapping[str, str | int]) -> None:
        self._socket().sendall(request_head(method, path, headers))

    def send(self, data: bytes | memoryview) -> None:
        self._socket().sendall(data)

    def getresponse(self, method: str) -> Answer:
        return Answer(self._socket(), method)

    def _socket(self) -> socket.socket:
        if self.sock is None:
            raise ProtocolError("not connected")
        return self.sock

    def round_trip_seconds(self) -> float | None:
        """The kernel's smoothed RTT of this connection, None when not connected or not known."""
        return round_trip_seconds(self.sock) if self.sock is not None else None

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()


def round_trip_seconds(sock: socket.socket) -> float | None:
    """A connected TCP socket's smoothed RTT from TCP_INFO (tcpi_rtt); None where the system has no TCP_INFO or no sample."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, option, 104)
    except OSError:
        return None
    micros = int.from_bytes(info[_TCPI_RTT], sys.byteorder) if len(info) >= _TCPI_RTT.stop else 0
    return micros / 1e6 if micros else None


def send_buffer_max(path: str = TCP_WMEM) -> int | None:
    """The most a TCP socket's send buffer may grow to here (tcp_wmem's third field), None where it cannot be read."""
    try:
        with open(path) as handle:
            fields = handle.read().split()
        return int(fields[2]) if len(fields) == 3 else None
    except (OSError, ValueError):
        return None
