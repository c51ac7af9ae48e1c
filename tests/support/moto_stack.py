"""Synthesize the Braid stack and create its pipeline in moto.

The template CDK synthesizes is the source: functions are created from their
assets (zipped from cdk.out) with their rendered environments, and the state
machine from its rendered DefinitionString. One documented compatibility
pass is applied for moto 5.2.5's Step Functions parser (`compat_definition`).

Not created: IAM policies, key policy, alarms, schedules and the layer (the
in-process handlers import the `braid` package the layer is built from).
"""

from __future__ import annotations

import io
import json
import re
import sys
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_FUNCTION_ID = re.compile(r"^Functions([A-Z][a-z]+)[0-9A-F]{8}$")


def cdk_context() -> dict[str, Any]:
    """The context `cdk synth` uses (cdk.json), so tests synthesize the same template."""
    return dict(json.loads((ROOT / "cdk.json").read_text())["context"])


@dataclass(frozen=True)
class SynthesizedStack:
    name: str
    template: dict[str, Any]
    outdir: Path
    assets: dict[str, Path]  # asset object key ("<hash>.zip") -> source directory


def synthesize(outdir: Path, *, stack_name: str = "Braid", nag: bool = True, **props: Any) -> SynthesizedStack:
    """Synthesize BraidStack offline with the Python API (cdk-nag on, as `cdk synth` runs it)."""
    infra = str(ROOT / "infra")
    if infra not in sys.path:
        sys.path.insert(0, infra)
    import aws_cdk as cdk

    from braid_infra.nag import add_nag_checks
    from braid_infra.stack import BraidStack

    app = cdk.App(context=cdk_context(), outdir=str(outdir))
    BraidStack(app, stack_name, **props)
    if nag:
        add_nag_checks(app)
    app.synth()
    template = json.loads((outdir / f"{stack_name}.template.json").read_text())
    manifest = json.loads((outdir / f"{stack_name}.assets.json").read_text())
    assets = {}
    for entry in manifest.get("files", {}).values():
        for destination in entry["destinations"].values():
            assets[destination["objectKey"]] = outdir / entry["source"]["path"]
    return SynthesizedStack(stack_name, template, outdir, assets)


def resources_of(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {lid: r for lid, r in template["Resources"].items() if r["Type"] == kind}


def braid_functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Braid's own Lambda functions: all but the one CDK adds to set the bucket's event notifications."""
    return {k: f for k, f in resources_of(template, "AWS::Lambda::Function").items() if not k.startswith("BucketNotificationsHandler")}


def data_key_id(template: dict[str, Any]) -> str:
    """The logical id of the key that wraps data keys (the Keys construct's; the alarm topic has its own)."""
    (key_id,) = [lid for lid in resources_of(template, "AWS::KMS::Key") if lid.startswith("Keys")]
    return key_id


def compat_definition(definition: str) -> str:
    """moto 5.2.5's ASL parser knows only STANDARD child workflows; EXPRESS children run as
    STANDARD there. The item processor of a Map that asked for EXPRESS is
    marked in its Comment (support.sfn_semantics.EXPRESS_MARK), so the
    emulated Step Functions still holds its children to Express's 5 minutes.
    A whole ToleratedFailurePercentage (`5`, as CDK renders it) is written `5.0`:
    moto's grammar accepts only a decimal number there, AWS both."""
    from support.sfn_semantics import EXPRESS_MARK

    doc = json.loads(definition)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("ToleratedFailurePercentage"), int):
                node["ToleratedFailurePercentage"] = float(node["ToleratedFailurePercentage"])
            processor = node.get("ItemProcessor")
            config = processor.get("ProcessorConfig") if isinstance(processor, dict) else None
            if isinstance(config, dict) and config.get("ExecutionType") == "EXPRESS":
                config["ExecutionType"] = "STANDARD"
                processor["Comment"] = f"{processor.get('Comment', '')} {EXPRESS_MARK}".strip()
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    return json.dumps(doc)


def zip_directory(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, path.relative_to(directory).as_posix())
    return buffer.getvalue()


@dataclass
class DeployedStack:
    bucket: str
    key_arn: str
    state_machine_arn: str  # the backup pipeline's
    functions: dict[str, str] = field(default_factory=dict)  # step ("worker") -> function name
    versions: dict[str, str] = field(default_factory=dict)  # logical id of an AWS::Lambda::Version -> its (qualified) ARN
    definition: str = ""
    state_machines: dict[str, str] = field(default_factory=dict)  # logical id -> ARN, every state machine of the stack
    verify_state_machine_arn: str = ""
    # The SQS event source mappings (the WAL worker's): {"queue_url", "queue_arn", "function", "batch_size", "window", "visibility"}
    event_sources: list[dict[str, Any]] = field(default_factory=list)


def state_machine_name(stack_name: str, logical_id: str) -> str:
    """The emulated name of a state machine: `STACK-Backup`, `STACK-Verify`, `STACK-Prune` (machine_kind)."""
    return f"{stack_name}-{machine_kind(logical_id)}"


def backup_machine_id(template: dict[str, Any]) -> str:
    """The backup pipeline's state machine (the stack has others: the prune's)."""
    (machine_id,) = [lid for lid in resources_of(template, "AWS::StepFunctions::StateMachine") if lid.startswith("Pipeline")]
    return machine_id


def backup_machine(template: dict[str, Any]) -> dict[str, Any]:
    return dict(template["Resources"][backup_machine_id(template)])


def deploy(stack: SynthesizedStack, session: Any, *, bucket: str | None = None) -> DeployedStack:
    """Create the stack's bucket, key, functions and state machine in moto (via `session`)."""
    from support.cfn_render import Resolver

    region = session.region_name or "us-east-1"
    s3, kms, iam = session.client("s3"), session.client("kms"), session.client("iam")
    lambda_, sfn = session.client("lambda"), session.client("stepfunctions")
    account = session.client("sts").get_caller_identity()["Account"]
    resolver = Resolver(region=region, account=account)
    template = stack.template

    (bucket_id,) = [lid for lid in resources_of(template, "AWS::S3::Bucket") if lid.startswith("StorageRepository")]
    bucket_name = bucket or f"braid-repository-{uuid.uuid4().hex[:12]}"
    # Object Lock is set when the bucket is made, as CloudFormation does (braid_infra.storage: no default retention).
    lock = {"ObjectLockEnabledForBucket": True} if template["Resources"][bucket_id]["Properties"].get("ObjectLockEnabled") else {}
    if region == "us-east-1":
        s3.create_bucket(Bucket=bucket_name, **lock)
    else:
        s3.create_bucket(Bucket=bucket_name, CreateBucketConfiguration={"LocationConstraint": region}, **lock)
    s3.put_bucket_versioning(Bucket=bucket_name, VersioningConfiguration={"Status": "Enabled"})
    resolver.refs[bucket_id] = bucket_name
    resolver.attributes[(bucket_id, "Arn")] = f"arn:aws:s3:::{bucket_name}"

    key_id = data_key_id(template)
    key = kms.create_key(Description="Braid data keys (emulated)")["KeyMetadata"]
    resolver.refs[key_id] = key["KeyId"]
    resolver.attributes[(key_id, "Arn")] = key["Arn"]

    role_arn = iam.create_role(
        RoleName=f"braid-emulated-{uuid.uuid4().hex[:8]}",
        AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}),
    )["Role"]["Arn"]
    for layer_id in resources_of(template, "AWS::Lambda::LayerVersion"):
        resolver.refs[layer_id] = f"arn:aws:lambda:{region}:{account}:layer:braid:1"

    deployed = DeployedStack(bucket_name, key["Arn"], "")
    queues = create_queues(session, template, resolver)
    # State machines get their ARNs first: a function's environment may name one (the maintenance starts the prune).
    machines = resources_of(template, "AWS::StepFunctions::StateMachine")
    for machine_id in machines:
        arn = f"arn:aws:states:{region}:{account}:stateMachine:{state_machine_name(stack.name, machine_id)}"
        resolver.refs[machine_id] = arn
        resolver.attributes[(machine_id, "Name")] = arn.rpartition(":")[2]
        deployed.state_machines[machine_id] = arn
    for lid, resource in resources_of(template, "AWS::Lambda::Function").items():
        match = _FUNCTION_ID.match(lid)
        if not match:
            continue
        props = resource["Properties"]
        source = stack.assets[props["Code"]["S3Key"]]
        created = lambda_.create_function(
            FunctionName=lid[:64],
            Runtime=props["Runtime"],
            Role=role_arn,
            Handler=props["Handler"],
            Code={"ZipFile": zip_directory(source)},
            Environment={"Variables": {k: str(resolver.render(v)) for k, v in props["Environment"]["Variables"].items()}},
            MemorySize=int(props.get("MemorySize", 128)),
            Timeout=int(props.get("Timeout", 3)),
            Architectures=props.get("Architectures", ["x86_64"]),
        )
        resolver.refs[lid] = created["FunctionName"]
        resolver.attributes[(lid, "Arn")] = created["FunctionArn"]
        deployed.functions[match.group(1).lower()] = created["FunctionName"]
    publish_versions(lambda_, template, resolver, deployed)
    apply_notifications(s3, template, resolver)
    deployed.event_sources = event_sources(template, resolver, queues)

    for machine_id, machine in machines.items():
        definition = compat_definition(resolver.render(machine["Properties"]["DefinitionString"]))
        created_machine = sfn.create_state_machine(
            name=state_machine_name(stack.name, machine_id),
            definition=definition,
            roleArn=role_arn,
            type=machine["Properties"].get("StateMachineType", "STANDARD"),
        )
        assert created_machine["stateMachineArn"] == deployed.state_machines[machine_id], created_machine["stateMachineArn"]
        if machine_id == backup_machine_id(template):
            deployed.state_machine_arn = created_machine["stateMachineArn"]
            deployed.definition = definition
        elif machine_kind(machine_id) == "Verify":
            deployed.verify_state_machine_arn = created_machine["stateMachineArn"]
    return deployed


def create_queues(session: Any, template: dict[str, Any], resolver: Any) -> dict[str, dict[str, str]]:
    """Each AWS::SQS::Queue (dead-letter queues first, as their ARNs are named by the others' RedrivePolicy)."""
    sqs = session.client("sqs")
    queues: dict[str, dict[str, str]] = {}
    pending = dict(resources_of(template, "AWS::SQS::Queue"))
    while pending:
        for lid, resource in list(pending.items()):
            props = resource.get("Properties", {})
            redrive = props.get("RedrivePolicy")
            target = redrive["deadLetterTargetArn"]["Fn::GetAtt"][0] if redrive else None
            if target is not None and target not in queues:
                continue
            attributes = {"VisibilityTimeout": str(props.get("VisibilityTimeout", 30)), "MessageRetentionPeriod": str(props.get("MessageRetentionPeriod", 345600))}
            if redrive:
                attributes["RedrivePolicy"] = json.dumps(
                    {"deadLetterTargetArn": queues[target]["arn"], "maxReceiveCount": int(redrive["maxReceiveCount"])}
                )
            url = sqs.create_queue(QueueName=f"braid-{lid}"[:80], Attributes=attributes)["QueueUrl"]
            arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            queues[lid] = {"url": url, "arn": arn, "visibility": attributes["VisibilityTimeout"]}
            resolver.refs[lid] = url
            resolver.attributes[(lid, "Arn")] = arn
            resolver.attributes[(lid, "QueueName")] = arn.rpartition(":")[2]
            del pending[lid]
    return queues


def apply_notifications(s3: Any, template: dict[str, Any], resolver: Any) -> None:
    """Each bucket's NotificationConfiguration (queues: the WAL queue), as CloudFormation sets it."""
    for lid, resource in resources_of(template, "AWS::S3::Bucket").items():
        configuration = resource.get("Properties", {}).get("NotificationConfiguration")
        if not configuration or lid not in resolver.refs:
            continue
        queues = [
            {
                "QueueArn": resolver.render(q["Queue"]),
                "Events": [q["Event"]],
                **({"Filter": {"Key": {"FilterRules": q["Filter"]["S3Key"]["Rules"]}}} if "Filter" in q else {}),
            }
            for q in configuration.get("QueueConfigurations", [])
        ]
        s3.put_bucket_notification_configuration(Bucket=resolver.refs[lid], NotificationConfiguration={"QueueConfigurations": queues})


def event_sources(template: dict[str, Any], resolver: Any, queues: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """The stack's SQS event source mappings, for the emulator's poller (support.sqs_poller)."""
    found = []
    by_arn = {q["arn"]: q for q in queues.values()}
    for resource in resources_of(template, "AWS::Lambda::EventSourceMapping").values():
        props = resource["Properties"]
        queue = by_arn[resolver.render(props["EventSourceArn"])]
        found.append(
            {
                "queue_url": queue["url"],
                "queue_arn": queue["arn"],
                "function": resolver.render(props["FunctionName"]),
                "batch_size": int(props.get("BatchSize", 10)),
                "window": float(props.get("MaximumBatchingWindowInSeconds", 0)),
                "visibility": int(queue["visibility"]),
                "partial": "ReportBatchItemFailures" in props.get("FunctionResponseTypes", []),
            }
        )
    return found


def publish_versions(lambda_: Any, template: dict[str, Any], resolver: Any, deployed: DeployedStack) -> None:
    """Each AWS::Lambda::Version of the template published, as CloudFormation does: the state machines name them."""
    for version_id, resource in resources_of(template, "AWS::Lambda::Version").items():
        try:
            function = resolver.render(resource["Properties"]["FunctionName"])
        except KeyError:  # a version of a function not emulated
            continue
        published = lambda_.publish_version(FunctionName=function)
        resolver.refs[version_id] = published["FunctionArn"]
        resolver.attributes[(version_id, "Version")] = published["Version"]
        deployed.versions[version_id] = published["FunctionArn"]


def machine_kind(logical_id: str) -> str:
    """"Backup" (braid_infra.pipeline), "Verify" (braid_infra.verify_pipeline) or "Prune"
    (braid_infra.prune_pipeline), by the construct that made it."""
    if logical_id.startswith("VerifyPipeline"):
        return "Verify"
    if logical_id.startswith("PrunePipeline"):
        return "Prune"
    if logical_id.startswith("Pipeline"):
        return "Backup"
    raise ValueError(f"unknown state machine {logical_id}")
