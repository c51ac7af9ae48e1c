"""Benchmark-only request timeline, loaded by sitecustomize when BRAID_BENCH_TIMELINE=PATH is set.

Appends one JSON line per HTTP request (and, in the agent, per chunk
handed to the uploader, per part task and per read) to PATH, so that the
agent's UploadParts and boto3's can be laid side by side
(bench_lib.timeline). botocore goes through http.client (by urllib3), the
agent's light client through braid.adapters.aws.light_wire: one wrapper
of each connection class gives the same `http` and `body` lines. Times are time.time() (epoch
seconds): the analysis compares them with the process's start.

It changes nothing the clients send or when; the cost is a few
microseconds per request and per chunk.
"""

import http.client
import json
import os
import threading
import time

_PATH = os.environ["BRAID_BENCH_TIMELINE"]
_LOCK = threading.Lock()
_OUT = open(_PATH, "a", buffering=1)  # noqa: SIM115 - open for the process's life
_PID = os.getpid()


def emit(kind, **fields):
    line = json.dumps({"k": kind, "pid": _PID, "thread": threading.current_thread().name, **fields})
    with _LOCK:
        _OUT.write(line + "\n")


_putrequest = http.client.HTTPConnection.putrequest
_putheader = http.client.HTTPConnection.putheader
_getresponse = http.client.HTTPConnection.getresponse


def putrequest(self, method, url, *args, **kwargs):
    self._bench_request = {"method": method, "path": url, "t0": time.time(), "bytes": 0}
    return _putrequest(self, method, url, *args, **kwargs)


def putheader(self, header, *values):
    request = getattr(self, "_bench_request", None)
    name = header.decode() if isinstance(header, bytes) else header
    if request is not None and name.lower() == "content-length" and values:
        value = values[0]
        request["bytes"] = int(value.decode() if isinstance(value, bytes) else value)
    return _putheader(self, header, *values)


def _answered(connection, call):
    """`call()`'s answer; then one "http" event for the request `connection` sent (either client)."""
    request = getattr(connection, "_bench_request", None)
    sent = time.time()
    try:
        return call()
    finally:
        if request is not None:
            try:
                port = connection.sock.getsockname()[1] if connection.sock is not None else None
            except OSError:
                port = None
            emit("http", sent=sent, head=time.time(), port=port, **request)
            connection._bench_request = None


def getresponse(self, *args, **kwargs):
    return _answered(self, lambda: _getresponse(self, *args, **kwargs))


_read = http.client.HTTPResponse.read


def read(self, *args, **kwargs):
    t0 = time.time()
    try:
        return _read(self, *args, **kwargs)
    finally:
        if time.time() - t0 > 0.05:  # a slow answer body (a CompleteMultipartUpload the server assembles first)
            emit("body", t0=t0, t1=time.time())


http.client.HTTPResponse.read = read
http.client.HTTPConnection.putrequest = putrequest
http.client.HTTPConnection.putheader = putheader
http.client.HTTPConnection.getresponse = getresponse


def _wrap_method(cls, name, kind, describe):
    real = getattr(cls, name)

    def wrapper(*args, **kwargs):
        t0 = time.time()
        try:
            return real(*args, **kwargs)
        finally:
            emit(kind, t0=t0, t1=time.time(), **describe(*args, **kwargs))

    setattr(cls, name, wrapper)


def _agent_wire(module):
    cls = module.Connection
    real_head, real_response = cls.send_head, cls.getresponse
    real_read = module.Answer.read

    def send_head(self, method, path, headers):
        length = next((v for k, v in headers.items() if k.lower() == "content-length"), 0)
        self._bench_request = {"method": method, "path": path, "t0": time.time(), "bytes": int(length)}
        return real_head(self, method, path, headers)

    def getresponse(self, method):
        return _answered(self, lambda: real_response(self, method))

    def answer_read(self, *args, **kwargs):
        t0 = time.time()
        try:
            return real_read(self, *args, **kwargs)
        finally:
            if time.time() - t0 > 0.05:
                emit("body", t0=t0, t1=time.time())

    cls.send_head, cls.getresponse, module.Answer.read = send_head, getresponse, answer_read


def _agent_uploader(module):
    _wrap_method(module.StagingUpload, "submit", "submit", lambda self, i, n, data, release: {"input": i, "n": n, "bytes": len(data)})


def _agent_sender(module):
    _wrap_method(module.PartSender, "_part_task", "part", lambda self, seg, part, chunks: {"segment": seg.number, "part": part, "chunks": len(chunks)})


def _agent_segments(module):
    real = module.complete_segment_upload

    def complete_segment_upload(uploads, store, segment, built):
        t0 = time.time()
        try:
            return real(uploads, store, segment, built)
        finally:
            emit("complete", t0=t0, t1=time.time(), segment=segment.number)

    module.complete_segment_upload = complete_segment_upload


def _agent_stream(module):
    real = module.read_full

    def read_full(handle, view):
        t0 = time.time()
        n = real(handle, view)
        emit("read", t0=t0, t1=time.time(), bytes=n)
        return n

    module.read_full = read_full
    _wrap_method(module.BufferPool, "acquire", "acquire", lambda self, cancelled: {})


def _boto3_upload(module):
    cls = module.UploadSeekableInputManager
    real = cls._get_upload_part_fileobj_with_full_size

    def wrapper(self, fileobj, **kwargs):
        t0 = time.time()
        out = real(self, fileobj, **kwargs)
        emit("read", t0=t0, t1=time.time(), bytes=out[1])
        return out

    cls._get_upload_part_fileobj_with_full_size = wrapper


REGISTER = {
    "braid.adapters.aws.light_wire": _agent_wire,
    "braid.agent.uploader": _agent_uploader,
    "braid.agent.part_sender": _agent_sender,
    "braid.engine.stream": _agent_stream,
    "braid.agent.segments": _agent_segments,
    "s3transfer.upload": _boto3_upload,
}
