"""The synthesized prune state machine moves a policy's old backups on the emulated cloud, each step as its own role.

Per-role IAM and the bucket policy are enforced (support.emulated_iam): the
Sweep's CopyObject onto each chunk must pass the create-only bucket policy
as a class change, TallyPrune writes the storage records, and a host's
`list --json` (the agent role) reads the class back from them.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from test_emulated_e2e import Emulator, braid, start_emulator  # noqa: F401  (the fixture)
from test_prune_cloud import DAY, repository_of, run_prune

from braid.format.layout import data_prefix, manifest_key
from braid.format.policy import KeepRules
from braid.format.storage_class import GLACIER_IR, StoragePolicy
from braid.ops.retention import save_policy
from braid.ops.storage_class import placements
from support.synthetic_backup import write_backup

pytestmark = pytest.mark.cloud


def test_the_state_machine_moves_old_backups_and_the_catalog_says_so(cloud: Emulator) -> None:
    repository, keys = repository_of(cloud)
    old = write_backup(repository, keys, "cold", DAY, chunks=3)
    newer = write_backup(repository, keys, "cold", DAY + timedelta(days=1))
    save_policy(repository, "cold", KeepRules(keep_last=2), StoragePolicy(GLACIER_IR, 30))  # both are years old

    output = run_prune(cloud, "prune-cold", {"prefix": ""})  # no rule given: the stored policies

    report = output["report"]
    assert report["ok"] and report["moved"] == sorted([str(old), str(newer)]) and report["objects_moved"] >= 2, json.dumps(report)
    s3 = cloud.client("s3")
    for ref in (old, newer):
        for info in repository.store.list(data_prefix(ref)):
            assert s3.head_object(Bucket=cloud.bucket, Key=info.key).get("StorageClass") == GLACIER_IR, info.key
        assert s3.head_object(Bucket=cloud.bucket, Key=manifest_key(ref)).get("StorageClass", "STANDARD") == "STANDARD"
    assert set(placements(repository.store)) == {old, newer}

    listed = braid(cloud, "host-agent-pg", "list", "--json")
    assert listed.code == 0, listed.stderr
    rows = {row["backup"]: row for row in json.loads(listed.stdout)}
    assert rows[str(old)]["storage"]["class"] == GLACIER_IR and rows[str(old)]["storage"]["per_month"] is not None

    again = run_prune(cloud, "prune-cold-again", {"prefix": ""})
    assert again["report"]["moved"] == [] and again["plan"]["moves"] == 0  # recorded: never moved twice
