"""Benchmark-only S3 compatibility shim for s3proxy, loaded into child processes.

The `cloud` benchmark puts this directory on PYTHONPATH of the processes it
starts (the agent `braid backup` and the boto3 reference) and sets
BRAID_BENCH_S3COMPAT=1; Python then imports this file at start-up. It never
touches product code: it registers one botocore handler in every new session
(through botocore's list of built-in handlers) that drops what s3proxy 2.6.0
answers with "501 NotImplemented" or a 500:

- the headers x-amz-checksum-algorithm / x-amz-checksum-type on
  CreateMultipartUpload, x-amz-checksum-mode on HeadObject and GetObject, and
  x-amz-checksum-crc64nvme / -type / x-amz-mp-object-size on
  CompleteMultipartUpload;
- the per-part ChecksumCRC64NVME elements in CompleteMultipartUpload's XML
  body (s3proxy's parser rejects unknown fields).

The agent's light client (braid.adapters.aws.light_http, no botocore) gets
the same edits through its REQUEST_HOOKS. Both are registered when their
module is first imported (an import hook), not here: importing
botocore.handlers at start-up would load botocore's client machinery into
every process and turn the agent's light client off.

Everything else the agent sends (UploadPart with its CRC64NVME header, PUT
with CRC64NVME and If-None-Match) goes out unchanged: s3proxy accepts those
headers but neither verifies the checksum nor honours If-None-Match. The
bytes on the wire and the client-side work (the agent still computes every
CRC) are the same as against S3, so CPU and throughput figures are not
flattered by the shim.
"""

import os

_REGISTER = {}  # module name -> callbacks run on it as it is first imported

if os.environ.get("BRAID_BENCH_S3COMPAT") == "1":
    import re

    _STRIP = {
        "CreateMultipartUpload": ("x-amz-checksum-algorithm", "x-amz-checksum-type", "x-amz-sdk-checksum-algorithm"),
        "HeadObject": ("x-amz-checksum-mode",),
        "GetObject": ("x-amz-checksum-mode",),
        "CompleteMultipartUpload": ("x-amz-checksum-crc64nvme", "x-amz-checksum-type", "x-amz-mp-object-size"),
    }
    _PART_CHECKSUM = re.compile(rb"<ChecksumCRC64NVME>[^<]*</ChecksumCRC64NVME>")

    def _s3proxy_compat(request, operation_name=None, **_kwargs):
        for header in _STRIP.get(operation_name, ()):
            if header in request.headers:
                del request.headers[header]
        if operation_name == "CompleteMultipartUpload" and request.data:
            body = request.data if isinstance(request.data, bytes) else request.data.encode()
            stripped = _PART_CHECKSUM.sub(b"", body)
            if stripped != body:
                request.data = stripped
                for header in ("Content-Length", "Content-MD5"):
                    if header in request.headers:
                        del request.headers[header]

    def _light_compat(operation, headers, body):
        strip = {h.lower() for h in _STRIP.get(operation, ())}
        for name in [n for n in headers if n.lower() in strip]:
            del headers[name]
        if operation == "CompleteMultipartUpload" and isinstance(body, bytes):
            body = _PART_CHECKSUM.sub(b"", body)
            for name in [n for n in headers if n.lower() == "content-length"]:
                headers[name] = str(len(body))
        return body

    _REGISTER.setdefault("botocore.handlers", []).append(lambda module: module.BUILTIN_HANDLERS.append(("before-sign.s3", _s3proxy_compat)))
    _REGISTER.setdefault("braid.adapters.aws.light_http", []).append(lambda module: module.REQUEST_HOOKS.append(_light_compat))

if os.environ.get("BRAID_BENCH_TIMELINE"):  # bench_lib.timeline: every request's start, end and connection
    import braid_bench_timeline

    for _name, _hook in braid_bench_timeline.REGISTER.items():
        _REGISTER.setdefault(_name, []).append(_hook)

if _REGISTER:
    import sys

    class _AfterImport:
        """Registers the shim in a module as it is first imported.

        A plain meta path finder: subclassing importlib.abc's would load importlib.resources, tempfile, bz2 and lzma
        into every child process, ~8 ms of CPU that the agent's start-up figure would carry and the agent never pays."""

        def find_spec(self, name, path=None, target=None):
            if name not in _REGISTER:
                return None
            for finder in sys.meta_path:  # what the import system would find without this finder
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            if spec.loader is None:
                return None
            real = spec.loader

            class _Loader:
                def create_module(self, spec):
                    return real.create_module(spec)

                def exec_module(self, module):
                    real.exec_module(module)
                    for hook in _REGISTER[name]:
                        hook(module)

            spec.loader = _Loader()
            return spec

    sys.meta_path.insert(0, _AfterImport())
