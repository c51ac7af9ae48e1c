"""LightS3's multipart calls, listings and DeleteObjects: their query strings and XML, as botocore writes and reads them.

Answers are the dicts botocore's client returns for the fields Braid reads
(keys of a ListObjectsV2 page decoded from `encoding-type=url`, as botocore
does); a parameter outside those below sends the call through botocore's
full client instead (LightS3.full).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote_plus
from xml.etree import ElementTree

from braid.adapters.aws.light_s3 import _text, _timestamp

if TYPE_CHECKING:
    from braid.adapters.aws.light_s3 import LightS3

_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
# botocore's CompletedPart members, in the model's order (its XML follows it).
_PART_FIELDS = ("ETag", "ChecksumCRC32", "ChecksumCRC32C", "ChecksumCRC64NVME", "ChecksumSHA1", "ChecksumSHA256", "PartNumber")
_PART_ANSWER = ("ChecksumCRC32", "ChecksumCRC32C", "ChecksumCRC64NVME", "ChecksumSHA1", "ChecksumSHA256")


def _q(value: Any) -> str:
    return quote(str(value), safe="-_.~")


def _query(pairs: list[tuple[str, Any]]) -> str:
    return "&".join(f"{k}={_q(v)}" if v is not None else k for k, v in pairs)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _root(body: bytes) -> ElementTree.Element:
    return ElementTree.fromstring(body)


def _children(node: ElementTree.Element, name: str) -> list[ElementTree.Element]:
    return node.findall(f"{{*}}{name}")


def _truncated(root: ElementTree.Element) -> bool:
    return (_text(root, "IsTruncated") or "false").lower() == "true"


def create_multipart_upload(client: LightS3, params: Mapping[str, Any]) -> dict[str, Any]:
    if set(params) - {"Bucket", "Key", "ChecksumAlgorithm", "ChecksumType"}:
        return dict(client.full().create_multipart_upload(**params))
    headers = {}
    if params.get("ChecksumAlgorithm"):
        headers["x-amz-checksum-algorithm"] = str(params["ChecksumAlgorithm"])
    if params.get("ChecksumType"):
        headers["x-amz-checksum-type"] = str(params["ChecksumType"])
    response = client._call("CreateMultipartUpload", "POST", params["Bucket"], params["Key"], "uploads", headers)
    root = _root(response.body)
    return {"Bucket": _text(root, "Bucket"), "Key": _text(root, "Key"), "UploadId": _text(root, "UploadId"), **_meta(response.status)}


def upload_part(client: LightS3, params: Mapping[str, Any]) -> dict[str, Any]:
    allowed = {"Bucket", "Key", "UploadId", "PartNumber", "Body", "ContentLength", "ChecksumAlgorithm", "ChecksumCRC64NVME"}
    if set(params) - allowed:
        return dict(client.full().upload_part(**params))
    body = params["Body"]
    headers = {"Content-Length": str(int(params.get("ContentLength", len(body))))}
    if params.get("ChecksumAlgorithm"):
        headers["x-amz-sdk-checksum-algorithm"] = str(params["ChecksumAlgorithm"])
    if params.get("ChecksumCRC64NVME"):
        headers["x-amz-checksum-crc64nvme"] = str(params["ChecksumCRC64NVME"])
    query = _query([("uploadId", params["UploadId"]), ("partNumber", int(params["PartNumber"]))])
    return client._answer(client._call("UploadPart", "PUT", params["Bucket"], params["Key"], query, headers, body))


def complete_document(parts: list[Mapping[str, Any]]) -> bytes:
    """The XML body: each part's fields in the order the caller gave them, as botocore's serializer writes them."""
    out = [f'<CompleteMultipartUpload xmlns="{_NS}">']
    for part in parts:
        fields = "".join(f"<{name}>{_escape(str(value))}</{name}>" for name, value in part.items() if name in _PART_FIELDS and value is not None)
        out.append(f"<Part>{fields}</Part>")
    out.append("</CompleteMultipartUpload>")
    return "".join(out).encode()


def complete_multipart_upload(client: LightS3, params: Mapping[str, Any]) -> dict[str, Any]:
    allowed = {"Bucket", "Key", "UploadId", "MultipartUpload", "ChecksumCRC64NVME", "ChecksumType", "MpuObjectSize"}
    if set(params) - allowed or set(params.get("MultipartUpload", {})) - {"Parts"}:
        return dict(client.full().complete_multipart_upload(**params))
    body = complete_document(list(params.get("MultipartUpload", {}).get("Parts", [])))
    headers = {"Content-Length": str(len(body))}
    if params.get("ChecksumCRC64NVME"):
        headers["x-amz-checksum-crc64nvme"] = str(params["ChecksumCRC64NVME"])
    if params.get("ChecksumType"):
        headers["x-amz-checksum-type"] = str(params["ChecksumType"])
    if params.get("MpuObjectSize") is not None:
        headers["x-amz-mp-object-size"] = str(int(params["MpuObjectSize"]))
    response = client._call("CompleteMultipartUpload", "POST", params["Bucket"], params["Key"], _query([("uploadId", params["UploadId"])]), headers, body)
    root = _root(response.body)
    out: dict[str, Any] = {name: _text(root, name) for name in ("Location", "Bucket", "Key", "ETag", "ChecksumCRC64NVME", "ChecksumType")}
    if "x-amz-version-id" in response.headers:
        out["VersionId"] = response.headers["x-amz-version-id"]
    return {k: v for k, v in out.items() if v is not None} | _meta(response.status)


def _meta(status: int) -> dict[str, Any]:
    return {"ResponseMetadata": {"HTTPStatusCode": status, "RetryAttempts": 0}}


def delete_document(delete: Mapping[str, Any]) -> bytes:
    """The XML body, fields in the caller's order (botocore's)."""
    out = [f'<Delete xmlns="{_NS}">']
    for field, value in delete.items():
        if field == "Objects":
            for item in value:
                inner = "".join(f"<{name}>{_escape(str(v))}</{name}>" for name, v in item.items() if name in ("Key", "VersionId"))
                out.append(f"<Object>{inner}</Object>")
        elif field == "Quiet":
            out.append(f"<Quiet>{'true' if value else 'false'}</Quiet>")
    out.append("</Delete>")
    return "".join(out).encode()


def delete_result(body: bytes) -> dict[str, Any]:
    root = _root(body)
    deleted = [{"Key": _text(node, "Key"), "VersionId": _text(node, "VersionId")} for node in _children(root, "Deleted")]
    errors = [
        {"Key": _text(node, "Key"), "VersionId": _text(node, "VersionId"), "Code": _text(node, "Code"), "Message": _text(node, "Message")}
        for node in _children(root, "Error")
    ]
    return {"Deleted": deleted, **({"Errors": errors} if errors else {}), **_meta(200)}


def _list_objects_v2(client: LightS3, **params: Any) -> Iterator[dict[str, Any]]:
    if set(params) - {"Bucket", "Prefix", "StartAfter", "Delimiter"}:
        yield from client.full().get_paginator("list_objects_v2").paginate(**params)
        return
    token = None
    while True:
        pairs: list[tuple[str, Any]] = [("list-type", 2)]
        pairs += [(name, params[key]) for key, name in (("Prefix", "prefix"), ("StartAfter", "start-after"), ("Delimiter", "delimiter")) if params.get(key)]
        if token:
            pairs.append(("continuation-token", token))
        pairs.append(("encoding-type", "url"))
        response = client._call("ListObjectsV2", "GET", params["Bucket"], None, _query(pairs), {})
        root = _root(response.body)
        page: dict[str, Any] = {"IsTruncated": _truncated(root), **_meta(response.status)}
        contents = [
            {
                "Key": unquote_plus(_text(node, "Key") or ""), "Size": int(_text(node, "Size") or 0), "ETag": _text(node, "ETag"),
                "LastModified": _timestamp(_text(node, "LastModified") or "1970-01-01T00:00:00Z"), "StorageClass": _text(node, "StorageClass"),
            }
            for node in _children(root, "Contents")
        ]
        if contents:
            page["Contents"] = contents
        prefixes = [{"Prefix": unquote_plus(_text(node, "Prefix") or "")} for node in _children(root, "CommonPrefixes")]
        if prefixes:
            page["CommonPrefixes"] = prefixes
        yield page
        token = _text(root, "NextContinuationToken")
        if not page["IsTruncated"] or not token:
            return


def _list_parts(client: LightS3, **params: Any) -> Iterator[dict[str, Any]]:
    if set(params) - {"Bucket", "Key", "UploadId"}:
        yield from client.full().get_paginator("list_parts").paginate(**params)
        return
    marker = None
    while True:
        pairs: list[tuple[str, Any]] = [("uploadId", params["UploadId"])] + ([("part-number-marker", marker)] if marker else [])
        response = client._call("ListParts", "GET", params["Bucket"], params["Key"], _query(pairs), {})
        root = _root(response.body)
        parts = []
        for node in _children(root, "Part"):
            part: dict[str, Any] = {"PartNumber": int(_text(node, "PartNumber") or 0), "Size": int(_text(node, "Size") or 0), "ETag": _text(node, "ETag")}
            part |= {name: _text(node, name) for name in _PART_ANSWER if _text(node, name) is not None}
            parts.append(part)
        yield {"Parts": parts, "IsTruncated": _truncated(root), **_meta(response.status)}
        marker = _text(root, "NextPartNumberMarker")
        if not _truncated(root) or not marker:
            return


def _list_multipart_uploads(client: LightS3, **params: Any) -> Iterator[dict[str, Any]]:
    if set(params) - {"Bucket", "Prefix"}:
        yield from client.full().get_paginator("list_multipart_uploads").paginate(**params)
        return
    key_marker = upload_marker = None
    while True:
        pairs: list[tuple[str, Any]] = [("uploads", None)] + ([("prefix", params["Prefix"])] if params.get("Prefix") else [])
        if key_marker:
            pairs.append(("key-marker", key_marker))
        if upload_marker:
            pairs.append(("upload-id-marker", upload_marker))
        response = client._call("ListMultipartUploads", "GET", params["Bucket"], None, _query(pairs), {})
        root = _root(response.body)
        uploads = [{"Key": _text(node, "Key"), "UploadId": _text(node, "UploadId")} for node in _children(root, "Upload")]
        yield {"Uploads": uploads, "IsTruncated": _truncated(root), **_meta(response.status)}
        key_marker, upload_marker = _text(root, "NextKeyMarker"), _text(root, "NextUploadIdMarker")
        if not _truncated(root) or not (key_marker or upload_marker):
            return


PAGINATORS = {"list_objects_v2": _list_objects_v2, "list_parts": _list_parts, "list_multipart_uploads": _list_multipart_uploads}
