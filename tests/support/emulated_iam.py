"""IAM in the emulated cloud: each handler signs with its own role, and every request is checked.

The stack's roles, their policies, the bucket policy and the key policy are
rendered from the synthesized template for the emulated resources. Each
in-process Lambda invocation signs its requests with credentials of its own
function's role (a context variable read by botocore's signer, carried into
the handler's thread pools), so the server sees which role asks. The
server's middleware maps each request to its IAM action, resource and
context keys (`authorize`) and answers AccessDenied, as AWS does, when
support.iam_policy's evaluation of the role's identity policies, the
bucket policy (S3) or the key policy (KMS) does not allow it.

Who is checked:
  - the handlers, each as its own role (access key `emulatedpipeline-<step>`);
  - hosts that sign with `host-agent-<NAME>` (the AgentRole, or any role
    with the AgentPolicy, tagged `braid-name=NAME`), `host-restore` (the
    RestoreRole) or `host-operator` (the OperatorRole: init, rekey); other access keys (the emulator's own `emulatedpipeline`,
    which deploys and runs Step Functions' own calls, and a test's free-form
    callers) are not checked, so existing tests and a plain `. env` session
    keep working.

The emulator's endpoint is plain HTTP on loopback, standing in for AWS's
HTTPS endpoints: requests carry `aws:SecureTransport` = true, so the bucket
policy's TLS-only statement holds for them as it does for SDKs on AWS.

A DeleteObjects request is refused whole when any of its keys is denied
(AWS answers 200 with a per-key AccessDenied error instead): stricter,
never more permissive.

S3 Object Lock as AWS authorizes it: a PUT carrying x-amz-object-lock-mode
is also checked for s3:PutObjectRetention, with the context keys
s3:object-lock-mode and s3:object-lock-retain-until-date; a version DELETE
with x-amz-bypass-governance-retention also for s3:BypassGovernanceRetention
(moto honours the header from anyone). KMS ReEncrypt is checked as
kms:ReEncryptFrom on its source key and kms:ReEncryptTo on its destination,
each with its own encryption context, and a request naming a key is checked
on that key (the stack's key policy applies to the stack's key only; another
key is checked against the policy a test gives it in `other_key_policies`,
and not at all without one).

Not modelled (nothing of Braid depends on them): SCPs, permission
boundaries, session policies, ACLs, the aws/s3 key's policy (SSE-KMS is not
emulated), VPC endpoint policies.
"""

from __future__ import annotations

import contextvars
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote
from xml.etree import ElementTree

from support.cfn_render import Resolver
from support.iam_policy import ALLOW, Request, evaluate
from support.moto_stack import data_key_id, resources_of

PIPELINE_PREFIX = "emulatedpipeline"
AGENT_PREFIX = "host-agent-"
RESTORE_KEY = "host-restore"
OPERATOR_KEY = "host-operator"
HOST_TAG = "braid-name"

# The role a handler's invocation signs as; None: the process's own credentials.
CALLER: contextvars.ContextVar[Any] = contextvars.ContextVar("emulated_iam_caller", default=None)


class _Lenient(Resolver):
    """Renders what the emulator created; anything else (log groups, X-Ray) as an ARN that matches nothing real."""

    def ref(self, name: str) -> str:
        try:
            return super().ref(name)
        except KeyError:
            return f"arn:aws:emulated:::{name}"

    def get_att(self, name: str, attribute: str) -> str:
        try:
            return super().get_att(name, attribute)
        except KeyError:
            return f"arn:aws:emulated:::{name}.{attribute}"


@dataclass
class Principal:
    """A role the emulator checks requests of."""

    role_id: str
    arn: str
    statements: list[dict[str, Any]]
    tags: dict[str, str] = field(default_factory=dict)

    def context(self) -> dict[str, str]:
        return {f"aws:PrincipalTag/{k}": v for k, v in self.tags.items()}


@dataclass
class StackIam:
    account: str
    region: str
    bucket: str
    roles: dict[str, Principal]  # role logical id -> principal
    function_roles: dict[str, str]  # function name -> role logical id
    bucket_policy: list[dict[str, Any]]
    key_arn: str
    key_policy: list[dict[str, Any]]
    agent_policy: list[dict[str, Any]]
    agent_role: str
    restore_role: str
    operator_role: str | None = None
    # Key policies of keys outside the stack a test models (a rekey's target), by ARN; others are not checked.
    other_key_policies: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def render(cls, template: dict[str, Any], resolver: Resolver, *, bucket: str, key_arn: str, functions: dict[str, str]) -> StackIam:
        """`resolver` knows the emulated bucket, key, state machine and functions; roles get ARNs here."""
        lenient = _Lenient(region=resolver.region, account=resolver.account, refs=dict(resolver.refs), attributes=dict(resolver.attributes))
        roles = resources_of(template, "AWS::IAM::Role")
        for lid in roles:
            arn = f"arn:aws:iam::{resolver.account}:role/{lid}"
            lenient.refs.setdefault(lid, lid)
            lenient.attributes.setdefault((lid, "Arn"), arn)
        managed = {lid: lenient.render(r["Properties"]["PolicyDocument"])["Statement"] for lid, r in resources_of(template, "AWS::IAM::ManagedPolicy").items()}
        for lid in managed:
            lenient.refs.setdefault(lid, f"arn:aws:iam::{resolver.account}:policy/{lid}")
        statements: dict[str, list[dict[str, Any]]] = {lid: [] for lid in roles}
        for policy in resources_of(template, "AWS::IAM::Policy").values():
            rendered = lenient.render(policy["Properties"]["PolicyDocument"])["Statement"]
            for role in policy["Properties"].get("Roles", []):
                statements[role["Ref"]].extend(rendered)
        for lid, role in roles.items():
            for attached in role["Properties"].get("ManagedPolicyArns", []):
                if isinstance(attached, dict) and attached.get("Ref") in managed:
                    statements[lid].extend(managed[attached["Ref"]])
        principals = {lid: Principal(lid, f"arn:aws:iam::{resolver.account}:role/{lid}", statements[lid]) for lid in roles}
        function_roles = {}
        for lid, function in resources_of(template, "AWS::Lambda::Function").items():
            role = function["Properties"].get("Role", {}).get("Fn::GetAtt", [None])[0]
            name = functions.get(lid)
            if name and role:
                function_roles[name] = role
        (bucket_policy,) = [
            lenient.render(p["Properties"]["PolicyDocument"])["Statement"]
            for p in resources_of(template, "AWS::S3::BucketPolicy").values()
            if lenient.render(p["Properties"]["Bucket"]) == bucket
        ]
        key = template["Resources"][data_key_id(template)]
        key_policy = lenient.render(key["Properties"]["KeyPolicy"])["Statement"]
        (agent_policy_id,) = [lid for lid in managed if lid.startswith("AccessAgentPolicy")]
        (agent_role,) = [lid for lid in roles if lid.startswith("AccessAgentRole")]
        (restore_role,) = [lid for lid in roles if lid.startswith("AccessRestoreRole")]
        operator_role = next((lid for lid in roles if lid.startswith("OperatorOperatorRole")), None)
        return cls(
            resolver.account, resolver.region, bucket, principals, function_roles, bucket_policy, key_arn, key_policy,
            managed[agent_policy_id], agent_role, restore_role, operator_role,
        )

    # -- who is asking ------------------------------------------------------------
    def principal_for(self, access_key: str) -> Principal | None:
        if access_key.startswith(f"{PIPELINE_PREFIX}-"):
            role = access_key.removeprefix(f"{PIPELINE_PREFIX}-")
            return self.roles.get(role)
        if access_key.startswith(AGENT_PREFIX):
            agent = self.roles[self.agent_role]
            return Principal(agent.role_id, agent.arn, agent.statements, {HOST_TAG: access_key.removeprefix(AGENT_PREFIX)})
        if access_key == RESTORE_KEY:
            return self.roles[self.restore_role]
        if access_key == OPERATOR_KEY and self.operator_role is not None:
            return self.roles[self.operator_role]
        return None

    def access_key_for(self, function_name: str) -> str | None:
        role = self.function_roles.get(function_name)
        return f"{PIPELINE_PREFIX}-{role}" if role else None

    # -- the decision ---------------------------------------------------------------
    def decide(self, principal: Principal, action: str, resource: str, context: dict[str, Any]) -> str:
        request = Request(principal.arn, action, resource, {"aws:SecureTransport": "true", **principal.context(), **context}, self.account)
        if action.startswith("s3:"):
            return evaluate(request, principal.statements, self.bucket_policy)
        if action.startswith("kms:") and resource != self.key_arn:
            other = self.other_key_policies.get(resource)
            return ALLOW if other is None else evaluate(request, principal.statements, other, key_policy=True)
        if action.startswith("kms:"):
            return evaluate(request, principal.statements, self.key_policy, key_policy=True)
        return evaluate(request, principal.statements)


# -- requests to (action, resource, context) -------------------------------------------


def s3_authorizations(method: str, path: str, query: dict[str, list[str]], headers: dict[str, str], body: bytes) -> list[tuple[str, str, dict[str, Any]]]:
    """The IAM checks S3 makes for one path-style request (Service Authorization Reference, Amazon S3)."""
    bucket, _, key = path.lstrip("/").partition("/")
    key = unquote(key)
    bucket_arn, object_arn = f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/{key}"
    versioned = "versionId" in query
    if not key:
        prefix = {"s3:prefix": query["prefix"][0]} if "prefix" in query else {}
        if method == "GET" and "uploads" in query:
            return [("s3:ListBucketMultipartUploads", bucket_arn, {})]
        if method == "GET" and "versions" in query:
            return [("s3:ListBucketVersions", bucket_arn, prefix)]
        if method == "POST" and "delete" in query:
            return [
                ("s3:DeleteObjectVersion" if version else "s3:DeleteObject", f"{bucket_arn}/{name}", {})
                for name, version in _deleted_objects(body)
            ]
        if method in ("GET", "HEAD") and not set(query) - {"list-type", "prefix", "delimiter", "continuation-token", "max-keys", "encoding-type", "start-after", "fetch-owner", "marker"}:
            return [("s3:ListBucket", bucket_arn, prefix)]
        return [(f"s3:{method}Bucket?{','.join(sorted(query))}", bucket_arn, {})]  # matches no Braid grant
    if method in ("GET", "HEAD") and "uploadId" in query:
        return [("s3:ListMultipartUploadParts", object_arn, {})]
    if method in ("GET", "HEAD"):
        return [("s3:GetObjectVersion" if versioned else "s3:GetObject", object_arn, {})]
    if method == "DELETE" and "uploadId" in query:
        return [("s3:AbortMultipartUpload", object_arn, {})]
    if method == "DELETE":
        bypass = versioned and headers.get("x-amz-bypass-governance-retention", "").lower() == "true"
        return [("s3:DeleteObjectVersion" if versioned else "s3:DeleteObject", object_arn, {})] + (
            [("s3:BypassGovernanceRetention", object_arn, {})] if bypass else []
        )
    if method == "PUT" and "retention" in query:
        return [("s3:PutObjectRetention", object_arn, {})]
    if method in ("PUT", "POST"):
        creates = (method == "PUT" and "partNumber" not in query) or (method == "POST" and "uploadId" in query)
        context: dict[str, Any] = {"s3:ObjectCreationOperation": "true" if creates else "false"}
        if creates and "if-none-match" in headers:
            context["s3:if-none-match"] = headers["if-none-match"]
        if creates and "if-match" in headers:
            context["s3:if-match"] = headers["if-match"]
        checks = [("s3:PutObject", object_arn, context)]
        if creates and "x-amz-copy-source" in headers:  # CopyObject: a PUT of the copy and a GET of its source
            source = unquote(headers["x-amz-copy-source"]).lstrip("/").partition("?")[0]
            context["s3:x-amz-copy-source"] = source
            for name in ("x-amz-storage-class", "x-amz-metadata-directive"):
                if name in headers:
                    context[f"s3:{name}"] = headers[name]
            checks.append(("s3:GetObject", f"arn:aws:s3:::{source}", {}))
        if creates and "x-amz-object-lock-mode" in headers:
            context["s3:object-lock-mode"] = headers["x-amz-object-lock-mode"]
            context["s3:object-lock-retain-until-date"] = headers.get("x-amz-object-lock-retain-until-date", "")
            checks.append(("s3:PutObjectRetention", object_arn, context))
        return checks
    return [(f"s3:{method}", object_arn, {})]


def _deleted_objects(body: bytes) -> list[tuple[str, str | None]]:
    root = ElementTree.fromstring(body)
    found = []
    for obj in root.iter():
        if obj.tag.rsplit("}", 1)[-1] == "Object":
            fields = {child.tag.rsplit("}", 1)[-1]: (child.text or "") for child in obj}
            found.append((fields.get("Key", ""), fields.get("VersionId")))
    return found


_KMS_WITH_CONTEXT = {"GenerateDataKey", "GenerateDataKeyWithoutPlaintext", "Decrypt", "Encrypt", "ReEncrypt"}


def _kms_key(named: Any, iam: StackIam) -> str:
    """The key a KMS request names, as an ARN (the stack's key when it names none, or names it otherwise)."""
    if not isinstance(named, str) or not named.startswith("arn:"):
        return iam.key_arn
    return named


def _kms_context(context: Any) -> dict[str, str]:
    return {f"kms:EncryptionContext:{k}": str(v) for k, v in (context or {}).items()}


def json_authorizations(service: str, operation: str, body: dict[str, Any], iam: StackIam) -> list[tuple[str, str, dict[str, Any]]]:
    """KMS, Step Functions and EventBridge requests the handlers or hosts make."""
    if service == "kms":
        if operation == "ReEncrypt":
            return [
                ("kms:ReEncryptFrom", _kms_key(body.get("SourceKeyId"), iam), _kms_context(body.get("SourceEncryptionContext"))),
                ("kms:ReEncryptTo", _kms_key(body.get("DestinationKeyId"), iam), _kms_context(body.get("DestinationEncryptionContext"))),
            ]
        context = _kms_context(body.get("EncryptionContext"))
        return [(f"kms:{operation}", _kms_key(body.get("KeyId"), iam), context if operation in _KMS_WITH_CONTEXT else {})]
    if service == "states":
        resource = body.get("stateMachineArn") or body.get("executionArn") or body.get("mapRunArn") or "*"
        return [(f"states:{operation}", resource, {})]
    if service == "events" and operation == "PutEvents":
        buses = {entry.get("EventBusName") or "default" for entry in body.get("Entries", [])} or {"default"}
        return [
            ("events:PutEvents", bus if bus.startswith("arn:") else f"arn:aws:events:{iam.region}:{iam.account}:event-bus/{bus}", {}) for bus in sorted(buses)
        ]
    return [(f"{service}:{operation}", "*", {})]


# -- the middleware's check ---------------------------------------------------------------

_S3_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code><Message>Access Denied</Message>'
    b"<RequestId>emulated</RequestId></Error>"
)


def deny_response(service: str, start_response: Callable[..., Any], message: str) -> list[bytes]:
    if service == "s3":
        start_response("403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(_S3_DENIED)))])
        return [_S3_DENIED]
    code = {"kms": "AccessDeniedException", "states": "AccessDeniedException", "events": "AccessDeniedException"}.get(service, "AccessDenied")
    body = json.dumps({"__type": code, "message": message}).encode()
    start_response("400 Bad Request", [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(body)))])
    return [body]


class Enforcer:
    """Checks each request of a checked caller; `denials` keeps what was refused (tests read it)."""

    def __init__(self, iam: StackIam) -> None:
        self.iam = iam
        self.denials: list[dict[str, str]] = []
        self._lock = threading.Lock()

    def check(self, caller: str, service: str, environ: dict[str, Any], body: bytes) -> str | None:
        """None when allowed (or the caller is not checked); else the denial message."""
        principal = self.iam.principal_for(caller)
        if principal is None:
            return None
        if service == "s3":
            query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
            headers = {k[5:].lower().replace("_", "-"): v for k, v in environ.items() if k.startswith("HTTP_")}
            checks = s3_authorizations(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "/"), query, headers, body)
        else:
            operation = environ.get("HTTP_X_AMZ_TARGET", "").rpartition(".")[2]
            try:
                payload = json.loads(body or b"{}")
            except ValueError:
                payload = {}
            checks = json_authorizations(service, operation, payload, self.iam)
        for action, resource, context in checks:
            if self.iam.decide(principal, action, resource, context) != ALLOW:
                message = f"User: {principal.arn} is not authorized to perform: {action} on resource: {resource}"
                with self._lock:
                    self.denials.append({"principal": principal.role_id, "action": action, "resource": resource})
                return message
        return None


# -- signing as the invoking function's role ----------------------------------------------


def _role_credentials(access_key: str) -> Any:
    from botocore.credentials import Credentials

    return Credentials(access_key, "emulated", None)


@contextmanager
def signing_as(access_key: str | None) -> Iterator[None]:
    """Requests made in this context (and in thread pools it submits to) sign with `access_key`."""
    token = CALLER.set(_role_credentials(access_key) if access_key else None)
    try:
        yield
    finally:
        CALLER.reset(token)


_installed: list[tuple[Any, str, Any]] = []


def install_signing() -> None:
    """botocore signs with CALLER's credentials when set; ThreadPoolExecutor tasks inherit the submitter's context."""
    if _installed:
        return
    from botocore.signers import RequestSigner

    original_auth = RequestSigner.get_auth_instance
    original_submit = ThreadPoolExecutor.submit

    def get_auth_instance(self: Any, signing_name: str, region_name: str, signature_version: Any = None, request_credentials: Any = None, **kwargs: Any) -> Any:
        caller = CALLER.get()
        return original_auth(self, signing_name, region_name, signature_version, request_credentials or caller, **kwargs)

    def submit(self: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        context = contextvars.copy_context()
        return original_submit(self, context.run, fn, *args, **kwargs)

    _installed.extend([(RequestSigner, "get_auth_instance", original_auth), (ThreadPoolExecutor, "submit", original_submit)])
    RequestSigner.get_auth_instance = get_auth_instance  # type: ignore[method-assign]
    ThreadPoolExecutor.submit = submit  # type: ignore[method-assign]


def uninstall_signing() -> None:
    while _installed:
        owner, name, value = _installed.pop()
        setattr(owner, name, value)

