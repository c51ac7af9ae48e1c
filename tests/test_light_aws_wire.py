"""The light clients' HTTP/1.1 (braid.adapters.aws.light_wire) against http.client, which it replaces on the agent's path.

Each answer is written into one end of a socket pair and read from the
other, by light_wire and by http.client, and the two must agree: status,
headers, body, whether the connection stays open, and what is refused.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from braid.adapters.aws.light_wire import Answer, Connection, ProtocolError, address_host, request_head


def _pair(data: bytes) -> socket.socket:
    ours, theirs = socket.socketpair()
    theirs.sendall(data)
    theirs.close()
    return ours


def _both(data: bytes, method: str = "GET") -> tuple[Answer, http.client.HTTPResponse]:
    ours = Answer(_pair(data), method)
    theirs = http.client.HTTPResponse(_pair(data), method=method)
    theirs.begin()
    return ours, theirs


ANSWERS = {
    "length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nx-amz-request-id: abc\r\n\r\nhello",
    "chunked, an extension and a trailer": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n",
    "to the close": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end",
    "HTTP/1.0": b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "HTTP/1.0 kept alive": b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok",
    "Connection: close": b"HTTP/1.1 503 Slow Down\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbad",
    "a 100 first": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nx-a: 1\r\n\r\n",
    "folded, repeated and padded headers": b"HTTP/1.1 200 OK\r\nx-a:   one  \r\nx-b: two\r\n  more\r\nX-A: again\r\nContent-Length: 0\r\n\r\n",
    "a negative length": b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nrest",
}


@pytest.mark.parametrize("name", list(ANSWERS))
def test_an_answer_reads_as_http_client_reads_it(name: str) -> None:
    ours, theirs = _both(ANSWERS[name])
    assert (ours.status, ours.getheaders(), ours.will_close) == (theirs.status, theirs.getheaders(), theirs.will_close)
    assert ours.read() == theirs.read()
    assert ours.read() == theirs.read() == b""


def test_a_head_answer_has_no_body_whatever_its_length() -> None:
    ours, theirs = _both(b"HTTP/1.1 200 OK\r\nContent-Length: 123\r\n\r\n", "HEAD")
    assert (ours.read(), ours.will_close) == (theirs.read(), theirs.will_close) == (b"", False)


@pytest.mark.parametrize("name", ["length", "chunked, an extension and a trailer"])
def test_a_streamed_body_reads_in_pieces_and_into_buffers(name: str) -> None:
    ours, _ = _both(ANSWERS[name])
    buffer = bytearray(3)
    got = ours.read(2)
    n = ours.readinto(buffer)
    got += bytes(buffer[:n]) + ours.read(100)
    _, theirs = _both(ANSWERS[name])
    assert got == theirs.read()
    assert ours.read(10) == b"" and ours.readinto(buffer) == 0


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "Remote end closed connection without response"),
        (b"SPDY/3 200 OK\r\n\r\n", "not an HTTP status line"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "not an HTTP status line"),
        (b"HTTP/2.0 200 OK\r\n\r\n", "unknown protocol"),
        (b"HTTP/1.1 200 OK\r\n" + b"x-a: 1\r\n" * 101 + b"\r\n", "got more than 100 headers"),
        (b"HTTP/1.1 200 OK\r\nx-a: " + b"a" * 70000 + b"\r\n\r\n", "got more than 65536 bytes in a header line"),
    ],
)
def test_what_http_client_refuses_is_a_protocol_error(data: bytes, message: str) -> None:
    with pytest.raises(http.client.HTTPException):
        http.client.HTTPResponse(_pair(data), method="GET").begin()
    with pytest.raises(ProtocolError, match=message):
        Answer(_pair(data), "GET")


@pytest.mark.parametrize(
    "data", [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nshort", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]
)
def test_a_body_cut_short_is_a_connection_error_as_http_clients_incomplete_read(data: bytes) -> None:
    ours, theirs = _both(data)
    with pytest.raises(http.client.HTTPException):
        theirs.read()
    with pytest.raises(ProtocolError) as caught:
        ours.read()
    assert isinstance(caught.value, OSError)  # the transport retries it as ConnectionClosedError


class _Capture:
    """A socket that keeps what http.client sends."""

    def __init__(self) -> None:
        self.sent = b""

    def sendall(self, data: bytes) -> None:
        self.sent += bytes(data)


def test_the_request_head_is_http_clients_byte_for_byte() -> None:
    headers = {"Host": "bucket.s3.amazonaws.com", "User-Agent": "braid-light/1", "x-amz-meta-name": "caf\u00e9", "Content-Length": "5"}
    connection = http.client.HTTPConnection("bucket.s3.amazonaws.com")
    capture = _Capture()
    connection.sock = capture  # type: ignore[assignment]
    connection.putrequest("PUT", "/repo/key?partNumber=1&uploadId=a%2Fb", skip_host=True, skip_accept_encoding=True)
    for name, value in headers.items():
        connection.putheader(name, value)
    connection.endheaders()
    assert request_head("PUT", "/repo/key?partNumber=1&uploadId=a%2Fb", headers) == capture.sent


@pytest.mark.parametrize(
    "method, path, headers",
    [("GET", "/a b", {}), ("GET\n", "/", {}), ("GET", "/", {"x-a": "one\r\nx-injected: two"}), ("GET", "/", {"x:a": "1"}), ("GET", "/", {" x": "1"})],
)
def test_what_http_client_will_not_send_is_refused(method: str, path: str, headers: dict[str, str]) -> None:
    connection = http.client.HTTPConnection("host")
    connection.sock = _Capture()  # type: ignore[assignment]
    with pytest.raises((ValueError, http.client.InvalidURL)):  # light_wire: ValueError, never retried as a dropped connection
        connection.putrequest(method, path)
        for name, value in headers.items():
            connection.putheader(name, value)
    with pytest.raises(ValueError):
        request_head(method, path, headers)


def test_a_folded_header_value_is_allowed_as_http_client_allows_it() -> None:
    assert request_head("GET", "/", {"x-a": "one\r\n two"}).endswith(b"x-a: one\r\n two\r\n\r\n")


def test_a_host_is_resolved_without_the_idna_codec_only_where_it_would_give_the_same_bytes() -> None:
    assert address_host("s3.us-east-1.amazonaws.com") == b"s3.us-east-1.amazonaws.com"
    assert address_host("127.0.0.1") == b"127.0.0.1"
    assert address_host("b\u00fccher.example") == "b\u00fccher.example"  # the codec's punycode
    long_label = "a" * 64 + ".example"
    assert address_host(long_label) == long_label  # the codec refuses it, with its own message
    with pytest.raises(UnicodeError):
        long_label.encode("idna")


@pytest.fixture
def keep_alive_server() -> Iterator[tuple[int, list[int]]]:
    """An HTTP/1.1 server that keeps connections open; records the client port of each request."""
    ports: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            ports.append(self.client_address[1])
            body = b"chunked" if self.path == "/chunked" else b"plain"
            self.send_response(200)
            if self.path == "/chunked":
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
            else:
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd.server_address[1], ports
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_one_connection_carries_request_after_request(keep_alive_server: tuple[int, list[int]]) -> None:
    port, ports = keep_alive_server
    connection = Connection("127.0.0.1", port, 10.0)
    connection.connect()
    try:
        bodies = []
        for path in ("/plain", "/chunked", "/plain"):
            connection.send_head("GET", path, {"Host": f"127.0.0.1:{port}"})
            answer = connection.getresponse("GET")
            bodies.append(answer.read())
            assert not answer.will_close
    finally:
        connection.close()
    assert bodies == [b"plain", b"chunked", b"plain"]
    assert len(set(ports)) == 1


def test_the_agents_http_loads_neither_email_nor_http_client_nor_ssl() -> None:
    """What the module exists for (tests/cloud/test_agent_startup.py pins the same for a whole cloud backup)."""
    script = "import sys, braid.adapters.aws.light_http\nprint(sorted(m for m in ('email', 'http.client', 'ssl', 'encodings.idna') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def _loopback_certificate(directory: Path) -> tuple[Path, Path]:
    """A throwaway self-signed certificate for 127.0.0.1 (IP address only): (certificate PEM, key PEM)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "braid-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_path, key_path


def test_over_tls_the_server_is_checked_by_name_against_the_ca_bundle(tmp_path: Path, keep_alive_server: tuple[int, list[int]]) -> None:
    """https: the context botocore's rules give (AWS_CA_BUNDLE here), the host sent as SNI and checked."""
    import ssl

    from braid.adapters.aws.light_http import _context

    cert, key = _loopback_certificate(tmp_path)
    port, _ = keep_alive_server
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    tls_port = listener.getsockname()[1]

    def relay() -> None:  # TLS in front of the plain server: one connection, bytes both ways
        while True:
            try:
                raw, _ = listener.accept()
            except OSError:
                return
            try:
                client = server_context.wrap_socket(raw, server_side=True)
            except (OSError, ssl.SSLError):
                raw.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", port))
            threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
            _pump(client, upstream)

    threading.Thread(target=relay, daemon=True).start()
    try:
        connection = Connection("127.0.0.1", tls_port, 10.0, _context(str(cert)))
        connection.connect()
        connection.send_head("GET", "/plain", {"Host": f"127.0.0.1:{tls_port}"})
        assert connection.getresponse("GET").read() == b"plain"
        connection.close()
        with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch|IP address mismatch|doesn't match"):
            Connection("localhost", tls_port, 10.0, _context(str(cert))).connect()
    finally:
        listener.close()


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        target.close()


def test_a_body_reads_into_a_mapped_buffer_in_place() -> None:
    """The restore path reads into mapped chunk buffers: readinto fills the caller's buffer, at most the body's length."""
    import mmap

    ours, _ = _both(ANSWERS["length"])
    buffer = mmap.mmap(-1, 8)
    assert ours.readinto(buffer) == 5 and buffer[:5] == b"hello"
    assert ours.readinto(buffer) == 0
