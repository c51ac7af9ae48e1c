#!/usr/bin/env python3
"""CDK app: `npx cdk synth` / `npx cdk deploy` (cdk.json points here).

Context:
  braid:stackName         stack name (default "Braid")
  braid:repositoryPrefix  key prefix of the repository in the bucket (default: bucket root)
  braid:retention         the scheduled prune's keep rules (braid_infra/schedules.py; default: none)
  braid:backupSchedules   backups EventBridge Scheduler runs on tagged hosts (braid_infra/backup_schedules.py)
  braid:alarmEmail        e-mail addresses for the alarm topic; braid:expectedBackups {NAME: hours} freshness alarms (monitoring.py)
  braid:objectLock        {"mode": "GOVERNANCE"|"COMPLIANCE", "days": N}: S3 Object Lock on chunks and manifests (storage.py)
cdk-nag's AWS Solutions checks run on every synth; findings that are
accepted are suppressed narrowly, with reasons, in braid_infra/nag.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aws_cdk as cdk  # noqa: E402

from braid_infra.nag import add_nag_checks  # noqa: E402
from braid_infra.stack import BraidStack  # noqa: E402


def main() -> None:
    app = cdk.App()
    name = app.node.try_get_context("braid:stackName") or "Braid"
    BraidStack(app, name, repository_prefix=app.node.try_get_context("braid:repositoryPrefix") or "")
    add_nag_checks(app)
    app.synth()


if __name__ == "__main__":
    main()
