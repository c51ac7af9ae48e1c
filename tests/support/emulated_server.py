"""The emulated cloud's server: moto's WSGI app behind a middleware that logs and misbehaves.

Split from support.emulated_cloud (which deploys the stack onto it): what a
request is (`s3_operation`, the SigV4 caller), the request log tests read,
and the faults tests ask for: the first N UploadPart requests answered 503
SlowDown (`Faults`), and S3 faults of every kind at a rate (support.s3_faults,
adjustable while the server runs through its control endpoint).
"""

from __future__ import annotations

import io
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote

from support.s3_faults import CONTROL_PATH, S3Faults, error_response, resetting_handler

if TYPE_CHECKING:
    from support.emulated_iam import Enforcer


def s3_operation(method: str, path: str, query: dict[str, list[str]], headers: dict[str, str]) -> tuple[str, str]:
    """(S3 operation name, key) of a path-style request."""
    _bucket, _, key = path.lstrip("/").partition("/")
    key = unquote(key)
    if method == "PUT" and "partNumber" in query and "uploadId" in query:
        return ("UploadPartCopy" if "x-amz-copy-source" in headers else "UploadPart"), key
    if method == "POST" and "uploads" in query:
        return "CreateMultipartUpload", key
    if method == "POST" and "uploadId" in query:
        return "CompleteMultipartUpload", key
    if method == "POST" and "delete" in query:
        return "DeleteObjects", ""
    if method == "DELETE" and "uploadId" in query:
        return "AbortMultipartUpload", key
    if method == "GET" and "uploadId" in query:
        return "ListParts", key
    if method == "GET" and "uploads" in query:
        return "ListMultipartUploads", ""
    if method == "GET" and "versions" in query and not key:
        return "ListObjectVersions", ""
    if not key:
        if method == "GET" and not (set(query) - {"list-type", "prefix", "delimiter", "continuation-token", "max-keys", "encoding-type", "start-after", "fetch-owner"}):
            return "ListObjects", ""
        return f"{method} bucket?{','.join(sorted(query))}", ""
    return {"GET": "GetObject", "PUT": "PutObject", "HEAD": "HeadObject", "DELETE": "DeleteObject"}.get(method, method), key


def _credential(authorization: str) -> tuple[str, str]:
    """(access key id, service) from a SigV4 Authorization header."""
    marker = "Credential="
    if marker not in authorization:
        return "", ""
    scope = authorization.split(marker, 1)[1].split(",", 1)[0].split("/")
    return (scope[0], scope[3]) if len(scope) >= 5 else (scope[0], "")


def _operation(environ: dict[str, Any]) -> str:
    """The API operation of a non-S3 request: JSON target, query-protocol Action, or REST method and path."""
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    if target:
        return target.rpartition(".")[2]
    action = parse_qs(environ.get("QUERY_STRING", "")).get("Action")
    if action:
        return action[0]
    if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
        action = parse_qs(_peek_body(environ).decode("utf-8", "replace")).get("Action")
        if action:
            return action[0]
    return f"{environ.get('REQUEST_METHOD', '')} {environ.get('PATH_INFO', '')}"


_INVOKE = re.compile(r"^/2015-03-31/functions/([^/]+)/invocations$")


def _peek_body(environ: dict[str, Any], limit: int = 1 << 20) -> bytes:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if not 0 < length <= limit:
        return b""
    body = environ["wsgi.input"].read(length)
    environ["wsgi.input"] = io.BytesIO(body)  # moto reads it again
    return body


def _resources(environ: dict[str, Any]) -> dict[str, Any]:
    """What a JSON-protocol request acts on (Step Functions ARNs, KMS key and encryption context)."""
    if not environ.get("HTTP_X_AMZ_TARGET") or not environ.get("CONTENT_TYPE", "").startswith("application/x-amz-json"):
        return {}
    try:
        body = json.loads(_peek_body(environ) or b"{}")
    except ValueError:
        return {}
    found: dict[str, Any] = {k: body[k] for k in ("stateMachineArn", "executionArn", "KeyId") if isinstance(body.get(k), str)}
    if isinstance(body.get("EncryptionContext"), dict):
        found["context"] = sorted(body["EncryptionContext"])
    return found


_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>emulated</RequestId></Error>"
)


class Faults:
    """What the server and the Lambdas are told to do wrong (tests)."""

    def __init__(self, s3_slowdown: int = 0) -> None:
        self.s3_slowdown = s3_slowdown
        self._lock = threading.Lock()

    def take_slowdown(self) -> bool:
        with self._lock:
            if self.s3_slowdown > 0:
                self.s3_slowdown -= 1
                return True
            return False


class RequestLog:
    def __init__(self, path: Path | None) -> None:
        self._file = open(path, "a", buffering=1) if path else None
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")


class Middleware:
    """Between the WSGI server and moto: logs requests, injects S3 faults."""

    def __init__(
        self, app: Callable[..., Any], faults: Faults, requests: RequestLog, s3_faults: S3Faults | None = None, iam: Enforcer | None = None
    ) -> None:
        self.app = app
        self.faults = faults
        self.requests = requests
        self.s3_faults = s3_faults
        self.iam = iam

    def _authorize(self, caller: str, service: str, environ: dict[str, Any]) -> str | None:
        """The denial message when IAM would refuse this request (support.emulated_iam), else None."""
        if self.iam is None or self.iam.iam.principal_for(caller) is None:
            return None
        needs_body = service != "s3" or (environ.get("REQUEST_METHOD") == "POST" and "delete" in environ.get("QUERY_STRING", ""))
        return self.iam.check(caller, service, environ, _peek_body(environ) if needs_body else b"")

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if self.s3_faults is not None and environ.get("PATH_INFO") == CONTROL_PATH:
            return self.s3_faults.control(environ, start_response)
        method = environ.get("REQUEST_METHOD", "")
        caller, service = _credential(environ.get("HTTP_AUTHORIZATION", ""))
        record: dict[str, Any] = {"t": round(time.time(), 3), "service": service, "caller": caller}
        # Which client sent it: the agent's light one (braid.adapters.aws.light_http.USER_AGENT) or botocore's.
        record["client"] = "light" if environ.get("HTTP_USER_AGENT", "").startswith("braid-light/") else "botocore"
        denied = self._authorize(caller, service, environ)
        if denied is not None:
            if service == "s3":
                query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
                headers = {k[5:].lower().replace("_", "-"): v for k, v in environ.items() if k.startswith("HTTP_")}
                op, key = s3_operation(method, environ.get("PATH_INFO", "/"), query, headers)
                record.update(op=op, key=key)
            else:
                record["op"] = _operation(environ)
            record.update(status=403 if service == "s3" else 400, denied=denied)
            self.requests.write(record)
            from support.emulated_iam import deny_response

            return deny_response(service, start_response, denied)
        if service == "s3":
            query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
            headers = {k[5:].lower().replace("_", "-"): v for k, v in environ.items() if k.startswith("HTTP_")}
            op, key = s3_operation(method, environ.get("PATH_INFO", "/"), query, headers)
            record.update(op=op, key=key)
            if "prefix" in query:
                record["prefix"] = query["prefix"][0]
            if op == "UploadPart":
                record["part"] = int(query["partNumber"][0])
                if self.faults.take_slowdown():
                    length = int(environ.get("CONTENT_LENGTH") or 0)
                    stream = environ["wsgi.input"]
                    while length > 0:  # drain the body, as S3 does before answering
                        got = stream.read(min(length, 1 << 20))
                        if not got:
                            break
                        length -= len(got)
                    record["status"] = 503
                    self.requests.write(record)
                    start_response("503 Slow Down", [("Content-Type", "application/xml"), ("Content-Length", str(len(_SLOWDOWN)))])
                    return [_SLOWDOWN]
            ranged = op == "GetObject" and "HTTP_RANGE" in environ
            kind = self.s3_faults.decide(op, caller, ranged=ranged) if self.s3_faults is not None else None
            if kind is not None:
                record.update(status=0 if kind == "reset" else int(kind), fault=kind)
                self.requests.write(record)
                return error_response(kind, environ, start_response)  # a reset raises InjectedReset
        else:
            record["op"] = _operation(environ)
            invoke = _INVOKE.match(environ.get("PATH_INFO", ""))
            if invoke and method == "POST":
                record.update(op="Invoke", function=unquote(invoke.group(1)))
            record.update(_resources(environ))

        def capture(status: str, response_headers: Any, exc_info: Any = None) -> Any:
            record["status"] = int(status.split(" ", 1)[0])
            for name, value in response_headers:
                if name.lower() == "x-amz-function-error":  # a Lambda handler raised
                    record["function_error"] = value
            return start_response(status, response_headers, exc_info) if exc_info else start_response(status, response_headers)

        result = self.app(environ, capture)
        record["done"] = round(time.time(), 3)  # when the store held it: a killed client's request may finish after the kill
        self.requests.write(record)
        return result


class EmulatorServer:
    """moto's ThreadedMotoServer, with the middleware in front of its WSGI app."""

    def __init__(self, port: int, middleware: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        from moto.moto_server.threaded_moto_server import ThreadedMotoServer

        self.port = port
        wrap = middleware

        class Server(ThreadedMotoServer):
            def _server_entry(self) -> None:
                from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
                from werkzeug.serving import make_server

                app = wrap(DomainDispatcherApplication(create_backend_app))
                self._server = make_server(self._ip_address, self._port, app, True, request_handler=resetting_handler(MotoRequestHandler))
                self._server_ready_event.set()
                self._server.serve_forever()

        self._server = Server(ip_address="127.0.0.1", port=port, verbose=False)

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
