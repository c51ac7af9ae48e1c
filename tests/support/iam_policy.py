"""IAM policy evaluation: the subset Braid's policies use, evaluated as AWS documents it.

moto can enforce identity policies itself (INITIAL_NO_AUTH_ACTION_COUNT),
but it matches every KMS request against the resource "*" (so a grant on a
key ARN never matches), ignores condition operators other than a
StringEquals on values it is handed, and has no bucket or key policies.
This module evaluates what the stack renders, and refuses (raises
`Unsupported`) any element it does not model rather than guessing.

What it models (IAM User Guide, "Policy evaluation logic" and "IAM JSON
policy elements"):
  - Effect Allow / Deny; Action / NotAction (case-insensitive, `*` and `?`);
    Resource / NotResource (case-sensitive wildcards); Principal of
    resource policies ("*", {"AWS": ARN or list}, {"Service": ...});
  - policy variables in Resource and in condition values,
    `${aws:PrincipalTag/KEY}` and any other key of the request context; a
    variable whose key is missing makes the element match nothing;
  - condition operators String(Not)Equals(IgnoreCase), String(Not)Like,
    Arn(Not)Equals, Arn(Not)Like, Bool, Null, each with ...IfExists:
    operators AND, keys AND, values OR; a missing key makes a positive
    operator false and a negated one true (IfExists: true); the set
    operators ForAllValues: and ForAnyValue: over the positive string ones
    (ForAllValues of a missing key holds);
  - the decision: an explicit Deny in any policy wins; otherwise an Allow in
    an identity policy or in the resource policy (same account) allows;
    otherwise the implicit deny. For a KMS key whose key policy does not
    delegate to IAM (no statement allowing the account root the action),
    only the key policy can allow.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ALLOW, DENY, IMPLICIT = "Allow", "Deny", "ImplicitDeny"


class Unsupported(Exception):
    """A policy element this evaluator does not model: extend it rather than guess."""


@dataclass(frozen=True)
class Request:
    """One authorization question: who, doing what, on what, in which context."""

    principal: str  # the role ARN (an assumed-role session is matched by its role's ARN)
    action: str  # "s3:GetObject"
    resource: str  # an ARN
    context: Mapping[str, str | list[str]] = field(default_factory=dict)  # "aws:PrincipalTag/braid-name": "db"
    account: str = "123456789012"


def _listify(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _literal_brackets(pattern: str, value: str) -> bool:
    """IAM has no character classes: `[` is literal."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.DOTALL) is not None


_VARIABLE = re.compile(r"\$\{([^}]+)\}")


def _substitute(pattern: str, context: Mapping[str, Any]) -> str | None:
    """The pattern with its policy variables resolved, or None when one has no value."""
    missing = False

    def value(match: re.Match[str]) -> str:
        nonlocal missing
        name = match.group(1)
        if name in ("*", "?", "$"):
            return name
        found = context.get(name)
        if found is None or isinstance(found, list):
            missing = True
            return ""
        return str(found)

    resolved = _VARIABLE.sub(value, pattern)
    return None if missing else resolved


def _matches_any(patterns: Iterable[str], value: str, *, case: bool, context: Mapping[str, Any] | None = None) -> bool:
    for pattern in patterns:
        resolved = _substitute(pattern, context or {}) if context is not None else pattern
        if resolved is not None and _literal_brackets(resolved if case else resolved.lower(), value if case else value.lower()):
            return True
    return False


def _string_test(operator: str, expected: str, actual: str) -> bool:
    if operator in ("StringEquals", "StringNotEquals"):
        return actual == expected
    if operator in ("StringEqualsIgnoreCase", "StringNotEqualsIgnoreCase"):
        return actual.lower() == expected.lower()
    if operator in ("StringLike", "StringNotLike", "ArnLike", "ArnNotLike"):
        return _literal_brackets(expected, actual)
    if operator in ("ArnEquals", "ArnNotEquals"):
        return actual == expected
    raise Unsupported(operator)


_NEGATED = {"StringNotEquals", "StringNotEqualsIgnoreCase", "StringNotLike", "ArnNotEquals", "ArnNotLike"}
_STRINGS = {"StringEquals", "StringEqualsIgnoreCase", "StringLike", "ArnEquals", "ArnLike"} | _NEGATED


def _condition_holds(operator: str, key: str, expected: Any, context: Mapping[str, Any]) -> bool:
    if operator.startswith(("ForAnyValue:", "ForAllValues:")):
        quantifier, _, base = operator.partition(":")
        if base not in _STRINGS - _NEGATED:
            raise Unsupported(f"set operator {operator}")
        values = [str(v) for v in _listify(context.get(key, []))]
        hits = [_condition_holds(base, key, expected, {key: value}) for value in values]
        return all(hits) if quantifier == "ForAllValues" else any(hits)  # ForAllValues of no value: true
    if_exists = operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    present = key in context
    if base == "Null":
        (wanted,) = {str(v).lower() for v in _listify(expected)}
        return (not present) == (wanted == "true")
    if not present:
        return True if if_exists else base in _NEGATED
    actual = [str(v) for v in _listify(context[key])]
    # A policy variable in a value takes the request's; one whose key is missing matches nothing.
    wanted = [w for w in (_substitute(str(v), context) for v in _listify(expected)) if w is not None]
    if base == "Bool":
        return any(a.lower() == w.lower() for a in actual for w in wanted)
    if base in _STRINGS:
        hit = any(_string_test(base, w, a) for a in actual for w in wanted)
        return not hit if base in _NEGATED else hit
    raise Unsupported(f"condition operator {operator}")


def conditions_hold(conditions: Mapping[str, Mapping[str, Any]], context: Mapping[str, Any]) -> bool:
    return all(_condition_holds(op, key, expected, context) for op, tests in conditions.items() for key, expected in tests.items())


def _principal_matches(element: Any, request: Request) -> bool:
    if element == "*":
        return True
    if not isinstance(element, Mapping):
        raise Unsupported(f"Principal {element!r}")
    for kind, values in element.items():
        for value in _listify(values):
            if kind == "AWS":
                if value == "*" or value == request.principal:
                    return True
                if value in (request.account, f"arn:aws:iam::{request.account}:root"):
                    continue  # the account: allows only through the principal's own identity policy
            elif kind == "Service":
                continue  # services are never the callers evaluated here
            else:
                raise Unsupported(f"Principal kind {kind}")
    return False


def statement_applies(statement: Mapping[str, Any], request: Request, *, resource_policy: bool) -> bool:
    unknown = set(statement) - {"Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Condition", "Principal"}
    if unknown or "NotPrincipal" in statement:
        raise Unsupported(f"statement elements {sorted(unknown)}")
    if resource_policy and not _principal_matches(statement.get("Principal"), request):
        return False
    if "Action" in statement:
        if not _matches_any(_listify(statement["Action"]), request.action, case=False):
            return False
    elif _matches_any(_listify(statement["NotAction"]), request.action, case=False):
        return False
    if "Resource" in statement:
        if not _matches_any(_listify(statement["Resource"]), request.resource, case=True, context=request.context):
            return False
    elif "NotResource" in statement:
        if _matches_any(_listify(statement["NotResource"]), request.resource, case=True, context=request.context):
            return False
    return conditions_hold(statement.get("Condition", {}), request.context)


def _decisions(statements: Iterable[Mapping[str, Any]], request: Request, *, resource_policy: bool) -> set[str]:
    return {s["Effect"] for s in statements if statement_applies(s, request, resource_policy=resource_policy)}


def _delegates_to_iam(key_policy: Iterable[Mapping[str, Any]], request: Request) -> bool:
    root = Request(f"arn:aws:iam::{request.account}:root", request.action, request.resource, request.context, request.account)
    for statement in key_policy:
        if statement.get("Effect") != "Allow":
            continue
        principals = _listify((statement.get("Principal") or {}).get("AWS", []) if isinstance(statement.get("Principal"), Mapping) else [])
        if any(p in (root.principal, request.account) for p in principals) and statement_applies(
            {k: v for k, v in statement.items() if k != "Principal"}, root, resource_policy=False
        ):
            return True
    return False


def evaluate(
    request: Request,
    identity: Iterable[Mapping[str, Any]],
    resource_policy: Iterable[Mapping[str, Any]] = (),
    *,
    key_policy: bool = False,
) -> str:
    """ALLOW, DENY (an explicit Deny applies) or IMPLICIT (nothing allows)."""
    identity, resource_policy = list(identity), list(resource_policy)
    mine = _decisions(identity, request, resource_policy=False)
    theirs = _decisions(resource_policy, request, resource_policy=True)
    if DENY in mine or DENY in theirs:
        return DENY
    if ALLOW in theirs:
        return ALLOW
    if ALLOW in mine and (not key_policy or _delegates_to_iam(resource_policy, request)):
        return ALLOW
    return IMPLICIT
