"""The emulated cloud: Braid's stack on a moto server on loopback (`scripts/emulated-aws`).

    scripts/emulated-aws [--port N] [--request-log FILE] [--fail-worker once|always|first=K]
                         [--fail-finalize once|always|first=K]
                         [--s3-slowdown N] [--fast-retries] [--time-scale S] [--object-lock MODE:DAYS]
                         [--s3-faults RATE [--s3-fault-kinds 500,503,reset]
                          [--s3-fault-seed N] [--s3-fault-callers agent|pipeline|all]]

Starts moto's server in this process (so the in-process Lambda hook of
support.inprocess_lambda applies), with Step Functions execution on, and
creates the stack's bucket, KMS key, functions and state machine from the
template CDK synthesizes (support.moto_stack). The synthesized template is
cached under build/emulated-cloud/, keyed by a hash of infra/, functions/,
cdk.json and the options that change it, so only the first start synthesizes.

It then does what an operator does after `cdk deploy`: a CloudFormation stack
named after the CDK stack holds the stack's outputs (rendered from the
template's own Outputs), and the real `braid init --repo s3://BUCKET --stack
NAME` writes the repository config from them. Once ready it prints, on stdout
and nothing else, `export NAME=VALUE` lines (AWS_ENDPOINT_URL,
AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, BRAID_REPO),
closes stdout, and serves until SIGINT or SIGTERM. Logs (the handlers'
Powertools lines included) go to stderr.

    scripts/emulated-aws > /tmp/braid.env &
    until grep -q BRAID_REPO /tmp/braid.env; do sleep 0.2; done
    . /tmp/braid.env
    .venv/bin/braid backup --name db --input /p1 --input /p2

Nothing in the product knows it runs on an emulator except the endpoint URL.

Where moto's Step Functions differ from AWS in what Braid depends on, the
emulator behaves as AWS does (support.sfn_semantics, which cites the AWS
pages): a Distributed Map whose failed items exceed its tolerated threshold
fails with States.ExceedToleratedFailureThreshold (moto: SUCCEEDED with
nulls); children of an EXPRESS map are held to 5 minutes (States.Timeout);
each Lambda is held to its Timeout (Sandbox.Timedout). Where moto's S3
differs under Object Lock, as AWS does too: a retain-until date in the
past is refused (support.s3_lock_semantics). A LIST with a delimiter names
only prefixes holding current objects, not delete markers
(support.s3_semantics). Each handler signs with its own role, and requests
are checked against the stack's rendered IAM policies, bucket policy and
key policy (support.emulated_iam; hosts are checked when they sign as
`host-agent-NAME`, `host-restore` or `host-operator`).

Test aids (never needed to use it):
  --request-log FILE   one JSON line per request the server answered:
                       {"service", "op", "key", "part", "status", "caller"};
                       "caller" is the access key id (the agent's is
                       AGENT_ACCESS_KEY, the pipeline's PIPELINE_ACCESS_KEY)
  --fail-worker MODE   the Worker Lambda raises StorageError (a transient
                       error its Retry covers): `once`, `always`, or
                       `first=K`: on its first K invocations, then it heals
                       (a test can exhaust the retries, then resume)
  --fail-sweep-item N  the prune's Sweep Lambda raises StorageError on map
                       item N, every attempt (repeatable)
  --fail-wal MODE      the WAL worker Lambda raises StorageError before it
                       processes its batch, as --fail-worker (every message is
                       delivered again)
  --sqs-redelivery S   a message left on the WAL queue (failed) is visible
                       again after S seconds, not the queue's visibility
                       timeout (support.sqs_poller emulates Lambda's poller)
  --fail-finalize MODE the Finalize Lambda raises StorageError, as --fail-worker
                       (a coordinator's failure: the backup is held for --resume)
  --no-iam             do not check requests against the stack's IAM policies
  --time-scale S       the service's clock runs S times faster than real
                       time: Retry intervals, Wait states, the Express
                       5-minute limit and Lambda timeouts all shrink by S
                       (their ratios stay as on AWS; default 1). Handlers
                       must then finish within timeout/S real seconds
                       (Plan's 60 s is 6 s at S=10): keep S modest
  --s3-slowdown N      the first N UploadPart requests get 503 SlowDown
  --fast-retries       synthesize the stack with 1 s, 3-attempt retry
                       policies (construct props), so exhausting them is quick
  --s3-faults RATE     once ready, fail RATE (0..1) of the S3 requests of
                       --s3-fault-callers (default: agent, i.e. every caller
                       but the in-process handlers; pipeline; all) with a
                       500, a 503 SlowDown or a connection reset
                       (--s3-fault-kinds), drawn from --s3-fault-seed; the
                       request log marks each with "fault". Settings and
                       counts change and read at runtime: POST/GET
                       /_emulator/s3-faults (support.s3_faults)

The server itself (request log, middleware, faults) is support.emulated_server.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from support.emulated_server import EmulatorServer, Faults, Middleware, RequestLog, free_port  # noqa: E402
from support.moto_stack import SynthesizedStack, data_key_id, resources_of  # noqa: E402
from support.s3_faults import CALLER_GROUPS, KINDS, S3Faults, settings_from_args  # noqa: E402

log = logging.getLogger("emulated-aws")

REGION = "us-east-1"
STACK_NAME = "Braid"
AGENT_ACCESS_KEY = "testing"
AGENT_SECRET_KEY = "testing"
# The emulator's own calls (deploying, and the in-process handlers) sign with
# this key, so a request log tells the agent's requests from the pipeline's.
PIPELINE_ACCESS_KEY = "emulatedpipeline"
CACHE_DIR = ROOT / "build" / "emulated-cloud"
CACHE_FORMAT = "1"
CACHE_KEEP = 8


# -- the synthesized template, cached ------------------------------------------


def _source_files() -> Iterable[Path]:
    yield ROOT / "cdk.json"
    for top in ("infra", "functions"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and "cdk.out" not in path.parts and path.suffix != ".pyc":
                yield path


def template_digest(options: dict[str, Any]) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps({"format": CACHE_FORMAT, "cdk": _cdk_version(), "options": options}, sort_keys=True).encode())
    for path in _source_files():
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def _cdk_version() -> str:
    """aws-cdk-lib's version (part of what synthesizes the template), without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aws-cdk-lib")
    except PackageNotFoundError:  # pragma: no cover
        return "?"


def _retry_props(fast: bool) -> dict[str, Any]:
    if not fast:
        return {}
    if str(ROOT / "infra") not in sys.path:
        sys.path.insert(0, str(ROOT / "infra"))
    from aws_cdk import Duration

    from braid_infra.pipeline import RetryPolicy

    quick = RetryPolicy(interval=Duration.seconds(1), max_attempts=3, backoff_rate=1.0, max_delay=Duration.seconds(1))
    return {"worker_retry": quick, "step_retry": quick}


def _prune_cache(cache_dir: Path, keep: int) -> None:
    """Keep the newest `keep` templates (each infra change adds one)."""
    entries = sorted((p for p in cache_dir.iterdir() if p.is_dir() and not p.name.startswith("synth-")), key=lambda p: p.stat().st_mtime)
    for stale in entries[:-keep]:
        shutil.rmtree(stale, ignore_errors=True)


def cached_stack(*, fast_retries: bool = False, object_lock: str | None = None, cache_dir: Path = CACHE_DIR) -> SynthesizedStack:
    """The synthesized stack: from the cache, or synthesized once (a few seconds) and cached.

    The layer is not built for the emulator (the in-process handlers import
    the editable `braid` package the layer is built from), so an empty layer
    asset stands in; everything else is what `cdk synth` writes.
    """
    options = {"stack": STACK_NAME, "fast_retries": fast_retries, "object_lock": object_lock}
    entry = cache_dir / template_digest(options)
    if not (entry / "template.json").is_file():
        started = time.monotonic()
        cache_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="synth-", dir=cache_dir))
        try:
            from support.moto_stack import synthesize

            layer = work / "layer"
            (layer / "python").mkdir(parents=True)
            lock = {"object_lock": object_lock} if object_lock else {}
            stack = synthesize(work / "cdk.out", stack_name=STACK_NAME, nag=False, layer_dir=layer, **_retry_props(fast_retries), **lock)
            staged = work / "entry"
            (staged / "assets").mkdir(parents=True)
            assets = {}
            for resource in resources_of(stack.template, "AWS::Lambda::Function").values():
                object_key = resource["Properties"]["Code"].get("S3Key")  # None: inline code (CDK's bucket notifications handler)
                if isinstance(object_key, str) and object_key in stack.assets:
                    shutil.copytree(stack.assets[object_key], staged / "assets" / object_key)
                    assets[object_key] = object_key
            (staged / "assets.json").write_text(json.dumps(assets, indent=1))
            (staged / "template.json").write_text(json.dumps(stack.template))
            try:
                staged.rename(entry)
            except OSError:  # another process cached the same digest first
                if not (entry / "template.json").is_file():
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log.info("synthesized the stack in %.1f s; cached in %s", time.monotonic() - started, entry)
        _prune_cache(cache_dir, keep=CACHE_KEEP)
    template = json.loads((entry / "template.json").read_text())
    assets = {key: entry / "assets" / name for key, name in json.loads((entry / "assets.json").read_text()).items()}
    return SynthesizedStack(STACK_NAME, template, entry, assets)


# -- deploying -------------------------------------------------------------------


def emulated_resolver(stack: SynthesizedStack, deployed: Any) -> Any:
    """A Resolver that renders the template's bucket, key and state machine as the emulated ones."""
    from support.cfn_render import Resolver

    template = stack.template
    resolver = Resolver(region=REGION)
    (bucket_id,) = [lid for lid in resources_of(template, "AWS::S3::Bucket") if lid.startswith("StorageRepository")]
    resolver.refs[bucket_id] = deployed.bucket
    resolver.attributes[(bucket_id, "Arn")] = f"arn:aws:s3:::{deployed.bucket}"
    key_id = data_key_id(template)
    resolver.refs[key_id] = deployed.key_arn.rpartition("/")[2]
    resolver.attributes[(key_id, "Arn")] = deployed.key_arn
    for machine_id, arn in deployed.state_machines.items():
        resolver.refs[machine_id] = arn
        resolver.attributes[(machine_id, "Name")] = arn.rpartition(":")[2]
    return resolver


def stack_outputs(stack: SynthesizedStack, deployed: Any) -> dict[str, dict[str, str]]:
    """The template's Outputs, rendered with the emulated resources (those it can render)."""
    template = stack.template
    resolver = emulated_resolver(stack, deployed)
    outputs = {}
    for name, output in template.get("Outputs", {}).items():
        try:
            value = resolver.render(output["Value"])
        except KeyError as exc:  # roles and policies: IAM is not emulated
            log.info("output %s not emulated (%s)", name, exc)
            continue
        outputs[name] = {"Value": str(value), "Description": output.get("Description", "")}
    return outputs


def stack_iam(stack: SynthesizedStack, deployed: Any) -> Any:
    """The stack's roles and policies, rendered for the emulated resources (support.emulated_iam)."""
    from support.emulated_iam import StackIam

    template = stack.template
    resolver = emulated_resolver(stack, deployed)
    functions = {lid: name for lid in resources_of(template, "AWS::Lambda::Function") for name in deployed.functions.values() if name == lid[:64]}
    for lid, name in functions.items():
        resolver.refs[lid] = name
        resolver.attributes[(lid, "Arn")] = f"arn:aws:lambda:{REGION}:{resolver.account}:function:{name}"
    for version_id, arn in deployed.versions.items():
        resolver.refs[version_id] = arn
    return StackIam.render(template, resolver, bucket=deployed.bucket, key_arn=deployed.key_arn, functions=functions)


def publish_outputs(session: Any, stack_name: str, outputs: dict[str, dict[str, str]]) -> None:
    """A CloudFormation stack holding the outputs, as `cdk deploy` leaves one."""
    template = {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": "Braid (emulated): outputs of the synthesized stack",
        "Resources": {"Placeholder": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
        "Outputs": outputs,
    }
    session.client("cloudformation").create_stack(StackName=stack_name, TemplateBody=json.dumps(template))


def agent_environment(endpoint: str, repo: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": AGENT_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": AGENT_SECRET_KEY,
        "BRAID_REPO": repo,
    }


def braid_init(environment: dict[str, str], stack_name: str) -> None:
    """The real `braid init --repo s3://BUCKET --stack NAME`, as the operator runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BRAID_"))}
    env.update(environment)
    done = subprocess.run(
        [sys.executable, "-m", "braid.cli", "init", "--repo", environment["BRAID_REPO"], "--stack", stack_name],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"braid init failed ({done.returncode}): {done.stderr.strip()}")
    log.info("%s", done.stderr.strip())


# -- main --------------------------------------------------------------------------


def fail_worker_mode(mode: str) -> str:
    fail_worker_times(mode)
    return mode


def fail_worker_times(mode: str) -> int | None:
    """How many invocations --fail-worker fails: `once` 1, `always` None (every one), `first=K` K."""
    if mode == "once":
        return 1
    if mode == "always":
        return None
    name, _, count = mode.partition("=")
    if name == "first" and count.isdigit() and int(count) > 0:
        return int(count)
    raise argparse.ArgumentTypeError(f"{mode!r}: use once, always or first=K (K >= 1)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="emulated-aws", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="loopback port (default: a free one)")
    parser.add_argument("--request-log", type=Path, help="append one JSON line per request answered")
    parser.add_argument("--fail-worker", type=fail_worker_mode, metavar="once|always|first=K",
                        help="make the Worker Lambda fail once, always, or on its first K invocations (tests)")
    parser.add_argument("--fail-sweep-item", type=int, action="append", default=[], metavar="N",
                        help="make the prune's Sweep Lambda fail on map item N, every attempt (tests; repeatable)")
    parser.add_argument("--fail-finalize", type=fail_worker_mode, metavar="once|always|first=K",
                        help="make the Finalize Lambda fail once, always, or on its first K invocations (tests)")
    parser.add_argument("--fail-wal", type=fail_worker_mode, metavar="once|always|first=K",
                        help="make the WAL worker Lambda fail its batch once, always, or on its first K invocations (tests)")
    parser.add_argument("--sqs-redelivery", type=float, metavar="SECONDS",
                        help="a message the WAL worker did not process is delivered again after this long (default: the queue's visibility timeout)")
    parser.add_argument("--time-scale", type=float, default=1.0, metavar="S",
                        help="run Step Functions' and Lambda's clocks S times faster than real time (tests)")
    parser.add_argument("--s3-slowdown", type=int, default=0, metavar="N", help="answer the first N UploadPart requests 503 SlowDown")
    parser.add_argument("--fast-retries", action="store_true", help="1 s, 3-attempt retry policies in the state machine (tests)")
    parser.add_argument("--s3-faults", type=float, default=0.0, metavar="RATE", help="fail RATE (0..1) of S3 requests once ready (tests)")
    parser.add_argument("--s3-fault-kinds", default=",".join(KINDS), metavar="KINDS", help=f"comma-separated, of {','.join(KINDS)} (default: all)")
    parser.add_argument("--s3-fault-seed", type=int, default=0, metavar="N", help="seed of the fault RNG (default 0)")
    parser.add_argument("--s3-fault-callers", choices=CALLER_GROUPS, default="agent", help="whose requests fail (default: agent)")
    parser.add_argument("--object-lock", metavar="MODE:DAYS",
                        help="the stack's braid:objectLock (GOVERNANCE:1): the bucket is made with Object Lock")
    parser.add_argument("--no-iam", action="store_true", help="do not check requests against the stack's IAM policies")
    parser.add_argument("--bucket", help="bucket name (default: braid-repository-<random>)")
    parser.add_argument("--exit-with-parent", action="store_true", help="stop when the process that started it ends (tests)")
    parser.add_argument("--debug", action="store_true", help="debug logging")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        s3_faults = S3Faults(settings_from_args(args.s3_faults, args.s3_fault_kinds, args.s3_fault_seed, args.s3_fault_callers),
                             pipeline_caller=PIPELINE_ACCESS_KEY)
    except ValueError as exc:
        print(f"emulated-aws: error: {exc}", file=sys.stderr)
        return 2
    # stdout carries the export lines and nothing else: everything printed
    # afterwards (moto, handlers' Powertools logs) goes to stderr.
    exports = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s emulated-aws %(levelname)s %(message)s")
    for noisy in ("werkzeug", "botocore", "urllib3", "moto"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*WaitConditionHandle.*")  # the outputs stack's placeholder

    port = args.port or free_port()
    endpoint = f"http://127.0.0.1:{port}"
    # This process's own AWS calls: deploying, and the handlers run in-process.
    for name in list(os.environ):
        if name.startswith("AWS_") or name == "BRAID_REPO":
            del os.environ[name]
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_ACCESS_KEY_ID": PIPELINE_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": "emulated",
            "MOTO_PORT": str(port),  # where moto's Step Functions interpreter sends its own calls
        }
    )

    started = time.monotonic()
    stack = cached_stack(fast_retries=args.fast_retries, object_lock=args.object_lock)

    import boto3
    from moto.core.config import default_user_config

    from braid.errors import StorageError
    from support.inprocess_lambda import InProcessLambdas
    from support.moto_stack import deploy
    from support.s3_lock_semantics import AwsObjectLock
    from support.s3_semantics import AwsS3
    from support.sfn_semantics import AwsStepFunctions

    default_user_config["stepfunctions"] = {"execute_state_machine": True}
    faults = Faults(s3_slowdown=args.s3_slowdown)
    requests = RequestLog(args.request_log)
    middlewares: list[Middleware] = []

    def middleware(app: Any) -> Middleware:
        middlewares.append(Middleware(app, faults, requests, s3_faults))
        return middlewares[-1]

    server = EmulatorServer(port, middleware)
    server.start()
    if args.time_scale <= 0:
        print("emulated-aws: error: --time-scale must be positive", file=sys.stderr)
        return 2
    AwsStepFunctions(time_scale=args.time_scale).install()
    AwsObjectLock().install()
    from support import s3_semantics

    s3_semantics.install()
    AwsS3().install()
    code_dir = Path(tempfile.mkdtemp(prefix="braid-emulated-lambdas-"))  # the handlers' code, removed when the emulator stops
    lambdas = InProcessLambdas(code_dir, time_scale=args.time_scale)
    lambdas.install()

    session = boto3.session.Session(region_name=REGION)
    deployed = deploy(stack, session, bucket=args.bucket)
    if not args.no_iam:
        from support.emulated_iam import Enforcer, install_signing

        enforcer = Enforcer(stack_iam(stack, deployed))
        install_signing()
        lambdas.credentials = enforcer.iam.access_key_for
        for gate in middlewares:
            gate.iam = enforcer
    if args.fail_worker is not None:
        worker = deployed.functions["worker"]
        lambdas.fail(
            worker,
            lambda: StorageError(f"injected fault: the emulator was started with --fail-worker {args.fail_worker}"),
            times=fail_worker_times(args.fail_worker),
        )
    for item in args.fail_sweep_item:
        lambdas.fail(
            deployed.functions["sweep"],
            lambda item=item: StorageError(f"injected fault: the emulator was started with --fail-sweep-item {item}"),
            times=None,
            when=lambda event, item=item: isinstance(event.get("item"), dict) and event["item"].get("n") == item,
        )
    if args.fail_finalize is not None:
        lambdas.fail(
            deployed.functions["finalize"],
            lambda: StorageError(f"injected fault: the emulator was started with --fail-finalize {args.fail_finalize}"),
            times=fail_worker_times(args.fail_finalize),
        )
    if args.fail_wal is not None:
        lambdas.fail(
            deployed.functions["walarchive"],
            lambda: StorageError(f"injected fault: the emulator was started with --fail-wal {args.fail_wal}"),
            times=fail_worker_times(args.fail_wal),
        )
    from support.sqs_poller import SqsPoller

    pollers = [SqsPoller(session, source, time_scale=args.time_scale, redelivery=args.sqs_redelivery) for source in deployed.event_sources]
    for poller in pollers:
        poller.start()
    publish_outputs(session, STACK_NAME, stack_outputs(stack, deployed))
    environment = agent_environment(endpoint, f"s3://{deployed.bucket}")
    braid_init(environment, STACK_NAME)
    s3_faults.enable()  # from now on: set-up above must not fail
    log.info(
        "ready in %.1f s: %s, bucket %s, state machine %s", time.monotonic() - started, endpoint, deployed.bucket, deployed.state_machine_arn
    )

    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if args.exit_with_parent:
        parent = os.getppid()

        def watch_parent() -> None:
            while not stop.wait(1.0):
                if os.getppid() != parent:
                    log.info("parent %d ended", parent)
                    stop.set()

        threading.Thread(target=watch_parent, name="watch-parent", daemon=True).start()
    for name, value in environment.items():
        exports.write(f"export {name}={shlex.quote(value)}\n")
    exports.close()

    while not stop.wait(3600):
        pass
    log.info("stopping")
    for poller in pollers:
        poller.stop.set()
    lambdas.uninstall()
    try:
        server.stop()
    finally:
        shutil.rmtree(code_dir, ignore_errors=True)
        sys.stderr.flush()
        # Executions may still be running in moto's threads; they end with us.
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
