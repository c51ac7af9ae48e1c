"""What a cloud backup loads: the agent's start-up is paid once per backup (and per `wal-push`).

The real CLI runs as a separate process against a moto server on loopback
(S3 and Step Functions, execution off) and records every module it loaded
(tests/test_startup.py's driver). Asserted on modules, never on timings:
`scripts/bench cloud` measures the CPU-seconds (`startup_cpu_seconds`).

The pattern a new command follows (see docs/design/agent-startup.md): the
command's module imports its adapters inside the handler; AWS clients come
from braid.adapters.aws.clients: for a cloud backup and `wal-push` the light
clients (braid.adapters.aws.light_clients: no botocore but its exception
classes), else built on the process's one botocore session (never `boto3`,
which adds s3transfer and its resource layer).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from tests.test_startup import DRIVER, found
from tests.wal_segments import write_segment

pytestmark = [pytest.mark.cloud]

BUCKET = "startup"

# Never on a cloud backup's path: the agent holds no key, computes no digest and compresses nothing, and builds its
# clients on botocore.
NOT_FOR_THE_AGENT = ("boto3", "s3transfer", "zstandard", "cryptography", "braid.engine.local", "braid.ops", "aws_lambda_powertools", "rich")
# botocore's client machinery and what it loads (~0.4 CPU-s): the light clients need none of it. botocore.exceptions
# (its error classes, which every adapter catches; a few ms, loading nothing else of botocore) is all that stays.
BOTOCORE_CLIENT = (
    "botocore.session", "botocore.client", "botocore.loaders", "botocore.endpoint", "botocore.httpsession", "botocore.auth",
    "botocore.regions", "botocore.handlers", "botocore.compat", "urllib3", "dateutil", "jmespath", "awscrt.auth", "awscrt.http",
)


@pytest.fixture
def cloud_repo(aws_env: None) -> Iterator[tuple[str, dict[str, str]]]:
    """A KMS repository whose config names a (never executed) state machine, on a moto server; the CLI's environment."""
    from braid.adapters.aws.clients import s3_client
    from braid.adapters.aws.s3 import S3Store
    from braid.format.repository import Repository, RepositoryConfig

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    try:
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30).close()  # moto's state is per process
        sfn = boto3.client("stepfunctions", endpoint_url=endpoint)
        arn = sfn.create_state_machine(
            name="startup", roleArn="arn:aws:iam::123456789012:role/startup",
            definition=json.dumps({"StartAt": "Noop", "States": {"Noop": {"Type": "Pass", "End": True}}}),
        )["stateMachineArn"]
        client = s3_client(endpoint_url=endpoint)
        client.create_bucket(Bucket=BUCKET)
        config = RepositoryConfig.new(
            {"type": "kms", "key_id": "arn:aws:kms:us-east-1:123456789012:key/startup"}, "2025-01-01T00:00:00Z",
            {"state_machine_arn": arn, "region": "us-east-1"},
        )
        Repository.create(S3Store(client, BUCKET, "repo"), config)
        yield f"s3://{BUCKET}/repo", env
    finally:
        server.stop()


# Not for an empty cloud backup either (issue 27: start-up <= 0.25 CPU-s): awscrt (~80 ms of CPU to load: the few small
# objects it reads and writes are checksummed in Python, braid.format.checksum), a chunk buffer's mapping (ctypes), the
# renderers and price tables (only for what is printed), a directory repository's store, WAL names' parsers, and
# configparser without an AWS config file to read.
NOT_FOR_AN_EMPTY_BACKUP = (
    "awscrt", "ctypes", "configparser", "braid.cli.render", "braid.cli.storage_render", "braid.format.prices",
    "braid.format.storage_class", "braid.format.summary", "braid.adapters.local", "braid.format.wal",
    "braid.format.pg_backup",  # a base backup's label parser: only for a stream that carried a backup_label
    "braid.format.tar_stream", "braid.engine.xbstream",  # the stream's parsers (braid.engine.capture): from its first block
)
# Nor for any cloud backup that does not wait (`--no-wait`, with data or without): it stages and starts the pipeline,
# so it reads no plan, no published manifest, no chain's records and no hold, and builds no verifier. The manifest's,
# the plan rounds' and the results' types, a chain's hand-off (captured index, parent record), a stopped backup's
# records (holds) and the pipeline's failure records load where a waiting or resuming agent, `status` or the pipeline
# uses them (~1 ms of CPU per dataclass on Python 3.11: docs/design/agent-startup.md).
NOT_FOR_A_STAGING_AGENT = (
    "braid.format.manifest", "braid.format.staging.rounds", "braid.format.staging.chain", "braid.format.staging.holds",
    "braid.adapters.aws.verify_runs", "braid.adapters.aws.stack_outputs", "braid.pipeline.failure", "braid.ports.keys",
)
# shutil (with bz2 and lzma, ~3 ms): argparse's formatter asks it for the terminal's width on every add_argument;
# braid.cli.help_format answers as it does without it.
NOT_FOR_A_COMMAND_LINE = ("shutil", "bz2", "lzma")
# The light clients' HTTP is braid.adapters.aws.light_wire: not http.client, which loads the email package (~0.02
# CPU-s), nor the idna codec (stringprep, unicodedata) for an ASCII host name. ssl loads only for an https endpoint
# (so on AWS, always; these runs use moto over plain http).
NOT_FOR_THE_AGENTS_HTTP = ("http.client", "email", "encodings.idna", "stringprep", "unicodedata")
NOT_OVER_PLAIN_HTTP = ("ssl", "_ssl")
# A cloud `wal-push` stages the file's raw bytes: no codec (zstandard, cryptography), no CRC library, no agent.
NOT_FOR_A_CLOUD_WAL_PUSH = ("zstandard", "cryptography", "braid.format.chunk", "awscrt", "braid.agent", "braid.cli.render", "braid.adapters.local")


def _no_aws_files(tmp_path: Path) -> dict[str, str]:
    return {"AWS_CONFIG_FILE": str(tmp_path / "no-config"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials")}


def _loaded(tmp_path: Path, env: dict[str, str], *words: str, stdin: bytes = b"") -> set[str]:
    record = tmp_path / "modules.json"
    full = {**{k: v for k, v in os.environ.items() if k != "BRAID_CONFIG"}, **env}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(record), *words], input=stdin, capture_output=True, env=full, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    return set(json.loads(record.read_text()))


def test_a_cloud_backup_loads_no_botocore_client_nor_boto3_nor_the_local_engine(tmp_path: Path, cloud_repo: tuple[str, dict[str, str]]) -> None:
    url, env = cloud_repo
    modules = _loaded(tmp_path, env, "backup", "--repo", url, "--name", "db", "--no-wait", "--allow-empty", "--quiet")
    assert {"braid.agent.uploader", "braid.adapters.aws.stepfunctions", "braid.adapters.aws.light_s3"} <= modules  # the run happened
    assert found(modules, NOT_FOR_THE_AGENT + BOTOCORE_CLIENT) == []
    assert found(modules, ("botocore",)) == [m for m in sorted(modules) if m == "botocore" or m.startswith(("botocore.exceptions", "botocore.vendored"))]


def test_an_empty_cloud_backup_loads_no_crc_library_no_chunk_buffer_and_no_renderer(tmp_path: Path, cloud_repo: tuple[str, dict[str, str]]) -> None:
    """`scripts/bench cloud`'s start-up row: the empty stream is found empty by its first read, before a buffer is mapped."""
    url, env = cloud_repo
    modules = _loaded(tmp_path, {**env, **_no_aws_files(tmp_path)}, "backup", "--repo", url, "--name", "db", "--no-wait", "--allow-empty")
    assert {"braid.agent.uploader", "braid.adapters.aws.light_s3", "braid.format.checksum"} <= modules  # the run happened
    pinned = NOT_FOR_AN_EMPTY_BACKUP + NOT_FOR_A_STAGING_AGENT + NOT_FOR_A_COMMAND_LINE + NOT_FOR_THE_AGENTS_HTTP + NOT_OVER_PLAIN_HTTP
    assert found(modules, NOT_FOR_THE_AGENT + BOTOCORE_CLIENT + pinned) == []


def test_a_cloud_backup_with_data_loads_the_crc_library_and_a_config_file_configparser(
    tmp_path: Path, cloud_repo: tuple[str, dict[str, str]]
) -> None:
    """The pins above are not vacuous: bytes to store load awscrt's CRC and a chunk buffer; an AWS config file is read."""
    url, env = cloud_repo
    config = tmp_path / "aws-config"
    config.write_text("[default]\nregion = us-east-1\n")
    files = {**_no_aws_files(tmp_path), "AWS_CONFIG_FILE": str(config)}
    modules = _loaded(tmp_path, {**env, **files}, "backup", "--repo", url, "--name", "db", "--no-wait", "--quiet", stdin=os.urandom(100_000))
    assert {"awscrt.checksums", "ctypes", "configparser", "braid.agent.uploader", "braid.format.tar_stream", "braid.engine.xbstream"} <= modules
    assert found(modules, NOT_FOR_THE_AGENT + BOTOCORE_CLIENT + NOT_FOR_A_STAGING_AGENT + NOT_FOR_THE_AGENTS_HTTP + NOT_OVER_PLAIN_HTTP) == []


def test_the_pinned_names_are_modules_that_exist() -> None:
    """A misspelt name would be absent from every run and pin nothing."""
    import importlib.util

    pinned = NOT_FOR_AN_EMPTY_BACKUP + NOT_FOR_A_STAGING_AGENT + NOT_FOR_A_CLOUD_WAL_PUSH + BOTOCORE_CLIENT + NOT_FOR_THE_AGENT + NOT_FOR_A_COMMAND_LINE
    pinned += NOT_FOR_THE_AGENTS_HTTP + NOT_OVER_PLAIN_HTTP
    assert [name for name in pinned if importlib.util.find_spec(name) is None] == []


def test_what_a_staging_agent_leaves_out_loads_where_it_is_used() -> None:
    """The lazy names still resolve: braid.format.staging's plan types and a stopped backup's records come from their
    modules (rounds, holds) on first use."""
    script = (
        "import sys, braid.format.staging as staging\n"
        "assert 'braid.format.staging.rounds' not in sys.modules\n"
        "from braid.format.staging import MapItem, Round\n"
        "from braid.format.staging.rounds import MapItem as M, Round as R\n"
        "assert (MapItem, Round) == (M, R)\n"
        "from braid.format.staging import HoldRecord, ItemFailure, ResumeRequest\n"
        "from braid.format.staging import holds\n"
        "assert (HoldRecord, ItemFailure, ResumeRequest) == (holds.HoldRecord, holds.ItemFailure, holds.ResumeRequest)\n"
        "try:\n    staging.NoSuchName\nexcept AttributeError as exc:\n    print(exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "module 'braid.format.staging' has no attribute 'NoSuchName'"


def test_a_cloud_wal_push_loads_no_botocore_client_nor_codec(tmp_path: Path, cloud_repo: tuple[str, dict[str, str]]) -> None:
    """`wal-push` on a repository with a pipeline stages the segment: PutObject and HeadObject through the light client."""
    url, env = cloud_repo
    path = write_segment(tmp_path, "000000010000000000000003")
    modules = _loaded(tmp_path, {**env, **_no_aws_files(tmp_path)}, "wal-push", "--repo", url, "--name", "pg", str(path))
    assert {"braid.ops.wal_stage", "braid.adapters.aws.wal_staging", "braid.adapters.aws.light_s3"} <= modules  # the push happened
    assert found(modules, ("boto3", "s3transfer", *BOTOCORE_CLIENT, *NOT_FOR_A_CLOUD_WAL_PUSH, *NOT_FOR_A_COMMAND_LINE, *NOT_FOR_THE_AGENTS_HTTP, *NOT_OVER_PLAIN_HTTP)) == []


def test_with_the_opt_out_a_cloud_backup_builds_botocores_clients(tmp_path: Path, cloud_repo: tuple[str, dict[str, str]]) -> None:
    """BRAID_AWS_CLIENT=botocore: the full clients, on the process's one botocore session (the pins above are not vacuous)."""
    url, env = cloud_repo
    modules = _loaded(tmp_path, {**env, "BRAID_AWS_CLIENT": "botocore"}, "backup", "--repo", url, "--name", "db", "--no-wait", "--allow-empty", "--quiet")
    assert {"braid.agent.uploader", "botocore.session", "botocore.client"} <= modules
    assert "braid.adapters.aws.light_s3" not in modules
    assert found(modules, NOT_FOR_THE_AGENT) == []


def test_backup_help_loads_no_sdk(tmp_path: Path) -> None:
    """`braid backup --help` (and a command's parser) declare options only: no SDK, no agent."""
    modules = _loaded(tmp_path, {}, "backup", "--help")
    assert found(modules, ("botocore", "awscrt", "cryptography", "braid.agent", "braid.adapters", *NOT_FOR_THE_AGENT)) == []


def test_clients_share_one_session_until_the_credentials_change(aws_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """One botocore session per process (models and endpoint data parsed once); new credentials get a new one."""
    from braid.adapters.aws.clients import s3_client, shared_session, stepfunctions_client

    first = shared_session()
    s3_client(), stepfunctions_client()
    assert shared_session() is first
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "other")
    assert shared_session() is not first


def test_an_unknown_service_is_refused_as_botocore_refuses_it(aws_env: None) -> None:
    from botocore.exceptions import DataNotFoundError, UnknownServiceError

    from braid.adapters.aws.clients import aws_client

    with pytest.raises(UnknownServiceError):
        aws_client("no-such-service")
    assert issubclass(UnknownServiceError, DataNotFoundError)
