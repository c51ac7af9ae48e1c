"""The emulator's IAM evaluator (support.iam_policy) against the rules the IAM User Guide states."""

from __future__ import annotations

from typing import Any

import pytest

from support.iam_policy import ALLOW, DENY, IMPLICIT, Request, Unsupported, conditions_hold, evaluate

ROLE = "arn:aws:iam::123456789012:role/Worker"
BUCKET = "arn:aws:s3:::repo"


def allow(action: str, resource: str, **extra: Any) -> dict[str, Any]:
    return {"Effect": "Allow", "Action": action, "Resource": resource, **extra}


def request(action: str, resource: str, **context: str) -> Request:
    return Request(ROLE, action, resource, context)


def test_actions_match_case_insensitively_and_resources_case_sensitively_with_wildcards() -> None:
    policy = [allow("s3:Get*", f"{BUCKET}/data/*")]
    assert evaluate(request("S3:GETOBJECT", f"{BUCKET}/data/x/1"), policy) == ALLOW
    assert evaluate(request("s3:GetObject", f"{BUCKET}/DATA/x"), policy) == IMPLICIT
    assert evaluate(request("s3:PutObject", f"{BUCKET}/data/x"), policy) == IMPLICIT
    assert evaluate(request("s3:GetObject", f"{BUCKET}/data[1]"), [allow("s3:GetObject", f"{BUCKET}/data[1]")]) == ALLOW  # no character classes


def test_an_explicit_deny_in_the_bucket_policy_wins_over_an_identity_allow() -> None:
    identity = [allow("s3:PutObject", f"{BUCKET}/data/*")]
    bucket = [{"Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "s3:PutObject", "Resource": f"{BUCKET}/data/*",
               "Condition": {"Null": {"s3:if-none-match": "true"}, "Bool": {"s3:ObjectCreationOperation": "true"}}}]
    overwrite = request("s3:PutObject", f"{BUCKET}/data/1", **{"s3:ObjectCreationOperation": "true"})
    create = request("s3:PutObject", f"{BUCKET}/data/1", **{"s3:ObjectCreationOperation": "true", "s3:if-none-match": "*"})
    part = request("s3:PutObject", f"{BUCKET}/data/1", **{"s3:ObjectCreationOperation": "false"})
    assert evaluate(overwrite, identity, bucket) == DENY
    assert evaluate(create, identity, bucket) == ALLOW
    assert evaluate(part, identity, bucket) == ALLOW


def test_a_missing_key_fails_positive_operators_and_passes_negated_ones_and_ifexists() -> None:
    """IAM User Guide, condition operators: "If the key ... is not present ... the condition is false. If the policy
    condition requires that the key is not matched, such as StringNotLike ..., the condition is true." """
    assert not conditions_hold({"StringLike": {"s3:prefix": "staging/*"}}, {})
    assert conditions_hold({"StringNotLike": {"s3:prefix": "staging/*"}}, {})
    assert conditions_hold({"StringLikeIfExists": {"s3:prefix": "staging/*"}}, {})
    assert not conditions_hold({"StringLikeIfExists": {"s3:prefix": "staging/*"}}, {"s3:prefix": "data/"})
    assert conditions_hold({"Null": {"kms:EncryptionContext:braid:backup": "false"}}, {"kms:EncryptionContext:braid:backup": "db@1"})
    assert not conditions_hold({"Null": {"kms:EncryptionContext:braid:backup": "false"}}, {})
    # Operators AND, keys AND, values OR.
    assert conditions_hold({"StringEquals": {"a": ["x", "y"]}, "Bool": {"b": "true"}}, {"a": "y", "b": "true"})
    assert not conditions_hold({"StringEquals": {"a": ["x", "y"]}, "Bool": {"b": "true"}}, {"a": "y", "b": "false"})


def test_a_policy_variable_resolves_from_the_context_and_without_a_value_matches_nothing() -> None:
    policy = [allow("s3:PutObject", BUCKET + "/staging/${aws:PrincipalTag/braid-name}/*")]
    tagged = {"aws:PrincipalTag/braid-name": "db"}
    assert evaluate(request("s3:PutObject", f"{BUCKET}/staging/db/1/session.json", **tagged), policy) == ALLOW
    assert evaluate(request("s3:PutObject", f"{BUCKET}/staging/other/1/session.json", **tagged), policy) == IMPLICIT
    assert evaluate(request("s3:PutObject", f"{BUCKET}/staging//1/session.json"), policy) == IMPLICIT
    assert evaluate(request("s3:PutObject", f"{BUCKET}/staging/db/1/session.json"), policy) == IMPLICIT


def test_a_key_policy_that_does_not_delegate_to_iam_is_the_only_grant() -> None:
    key = "arn:aws:kms:us-east-1:123456789012:key/k"
    identity = [allow("kms:Decrypt", key)]
    names_role = [{"Effect": "Allow", "Principal": {"AWS": ROLE}, "Action": "kms:Decrypt", "Resource": "*"}]
    admin_only = [{"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"}, "Action": "kms:Describe*", "Resource": "*"}]
    delegates = [{"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"}, "Action": "kms:*", "Resource": "*"}]
    assert evaluate(request("kms:Decrypt", key), [], names_role, key_policy=True) == ALLOW
    assert evaluate(request("kms:Decrypt", key), identity, admin_only, key_policy=True) == IMPLICIT
    assert evaluate(request("kms:Decrypt", key), identity, delegates, key_policy=True) == ALLOW
    assert evaluate(request("kms:Decrypt", key), [], delegates, key_policy=True) == IMPLICIT


def test_elements_it_does_not_model_are_refused_rather_than_guessed() -> None:
    with pytest.raises(Unsupported):
        conditions_hold({"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}, {"aws:SourceIp": "10.1.2.3"})
    with pytest.raises(Unsupported):
        conditions_hold({"ForAnyValue:StringNotEquals": {"aws:TagKeys": "a"}}, {"aws:TagKeys": ["a"]})
    with pytest.raises(Unsupported):
        evaluate(request("s3:GetObject", f"{BUCKET}/x"), [{"Effect": "Allow", "NotPrincipal": {"AWS": ROLE}, "Action": "*", "Resource": "*"}])


def test_set_operators_and_variables_in_condition_values_as_iam_evaluates_them() -> None:
    """What the AgentRole's trust uses: a session tag must equal the caller's own tag, and no other tag key is passed."""
    same = {"StringEquals": {"aws:RequestTag/braid-name": "${aws:PrincipalTag/braid-name}"}}
    assert conditions_hold(same, {"aws:RequestTag/braid-name": "pg", "aws:PrincipalTag/braid-name": "pg"})
    assert not conditions_hold(same, {"aws:RequestTag/braid-name": "other", "aws:PrincipalTag/braid-name": "pg"})
    assert not conditions_hold(same, {"aws:RequestTag/braid-name": "pg"})  # the caller untagged: the variable resolves to nothing
    only = {"ForAllValues:StringEquals": {"aws:TagKeys": ["braid-name"]}}
    assert conditions_hold(only, {"aws:TagKeys": ["braid-name"]}) and conditions_hold(only, {})
    assert not conditions_hold(only, {"aws:TagKeys": ["braid-name", "team"]})
    assert conditions_hold({"ForAnyValue:StringLike": {"aws:TagKeys": "braid-*"}}, {"aws:TagKeys": ["team", "braid-name"]})
