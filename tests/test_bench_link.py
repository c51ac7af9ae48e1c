"""The `link` benchmark's parts: the shaped veth pair, the wire trace, the server's CPU and the blob store (scripts/bench_lib)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

from bench_lib.benchmarks.link import _blob_dir, _is_tmpfs, _links  # noqa: E402
from bench_lib.delay_line import parse_stats  # noqa: E402
from bench_lib.netns import LinkError, ShapedLink, WireTrace, wire_ceiling  # noqa: E402
from bench_lib.timing import process_cpu_seconds  # noqa: E402


def test_links_parse_rate_and_rtt() -> None:
    assert _links("1000x0,10000x20,500") == [(1000, 0.0), (10000, 20.0), (500, 0.0)]


def test_wire_ceiling_is_tcp_payload_over_the_frame_tc_counts() -> None:
    assert wire_ceiling(1500) == pytest.approx(1448 / 1514)
    assert round(wire_ceiling(1500), 3) == 0.956  # below 0.95 + start-up: the 1500-byte link cannot give 0.95
    assert round(wire_ceiling(9000), 3) == 0.993


def test_wire_trace_splits_a_run_into_lead_wire_slow_and_tail() -> None:
    rate = 100.0  # bytes per second
    # start at 0; nothing until 1 (start-up), full rate 1-3, half rate 3-5, full 5-6, then idle to the end at 9
    points = [(0.0, 0), (1.0, 0), (2.0, 100), (3.0, 200), (4.0, 250), (5.0, 300), (6.0, 400), (7.0, 400), (8.0, 400), (9.0, 400)]
    got = WireTrace(points).between(0.0, 9.0, rate)
    assert got == {"wire_s": 4.0, "lead_s": 1.0, "tail_s": 3.0, "slow_s": 1.0}
    assert sum(got.values()) == 9.0
    # outside samples are ignored; too few inside gives zeros, never a division by nothing
    assert WireTrace(points).between(20.0, 30.0, rate) == {"wire_s": 0.0, "lead_s": 0.0, "tail_s": 0.0, "slow_s": 0.0}


def test_wire_trace_with_nothing_busy_is_all_lead() -> None:
    got = WireTrace([(0.0, 0), (1.0, 1), (2.0, 2)]).between(0.0, 2.0, 1000.0)
    assert got["lead_s"] == 2.0 and got["tail_s"] == 0.0


def test_process_cpu_seconds_grows_with_work_and_fails_for_a_gone_process() -> None:
    before = process_cpu_seconds(os.getpid())
    total = 0
    while process_cpu_seconds(os.getpid()) <= before:  # spin until the kernel accounts at least one tick
        total += sum(range(10_000))
    assert process_cpu_seconds(os.getpid()) > before >= 0
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(FileNotFoundError):
        process_cpu_seconds(proc.pid)


def test_tmpfs_is_read_from_the_mount_table(tmp_path: Path) -> None:
    mounts = "tmpfs /dev/shm tmpfs rw,nosuid 0 0\n/dev/vda / ext4 rw 0 0\n"
    assert _is_tmpfs(Path("/dev/shm"), mounts)
    assert not _is_tmpfs(Path("/"), mounts)
    assert not _is_tmpfs(Path("/dev/shm"), "/dev/vda / ext4 rw 0 0\n")
    assert _blob_dir("disk", tmp_path) == tmp_path / "s3proxy-blobs"
    if _is_tmpfs(Path("/dev/shm")):
        assert _blob_dir("tmpfs", tmp_path) == Path(f"/dev/shm/braid-bench-link-{os.getpid()}")


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc")), reason="needs root, ip and tc")


def _show(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True).stdout


@needs_root
def test_shaped_link_sets_the_mtu_and_tbf_on_both_ends_and_removes_everything() -> None:
    with ShapedLink(tag=f"9{os.getpid() % 100000}", mtu=9000) as link:
        link.shape(1000, 0)
        assert "mtu 9000" in _show("ip", "link", "show", link.host_if)
        assert "mtu 9000" in _show("ip", "-n", link.ns, "link", "show", link.ns_if)
        for qdisc in (_show("tc", "qdisc", "show", "dev", link.host_if), _show("tc", "-n", link.ns, "qdisc", "show", "dev", link.ns_if)):
            assert "tbf" in qdisc and "rate 1Gbit" in qdisc
            assert "burst 500000b" in qdisc  # a 4 ms tick's worth at 1 Gbit/s: a raw TCP stream reaches wire_ceiling
        if not link.can_delay:  # no build directory: only netem could delay
            with pytest.raises(LinkError, match="a delay cannot be made: this kernel has no sch_netem"):
                link.shape(1000, 20)
        ns, host_if = link.ns, link.host_if
    assert ns not in _show("ip", "netns", "list")
    assert subprocess.run(["ip", "link", "show", host_if], capture_output=True).returncode != 0



def test_delay_line_counters_are_read_from_its_last_line() -> None:
    text = "noise\ndelayline: queue 0 delay_us 500 packets 12 dropped 1 most_waiting 3 latest_release_us 41.5 cpu_s 0.020 seconds 2.500\n"
    assert parse_stats(text) == {"delay_us": 500.0, "packets": 12.0, "dropped": 1.0, "most_waiting": 3.0, "latest_release_us": 41.5,
                                 "cpu_s": 0.02, "seconds": 2.5}
    assert parse_stats("delayline: netlink socket: Operation not permitted\n") == {}


def _listener(link: ShapedLink) -> tuple[subprocess.Popen, int]:
    """A TCP listener inside the link's namespace that accepts and closes: what a connect's RTT is timed against."""
    code = ("import socket,sys\ns=socket.create_server((sys.argv[1],0));print(s.getsockname()[1],flush=True)\n"
            "while True: s.accept()[0].close()")
    proc = subprocess.Popen([*link.wrap, sys.executable, "-c", code, link.ns_ip], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())  # type: ignore[union-attr]


@needs_root
@pytest.mark.skipif(not (shutil.which("cc") and shutil.which("iptables")), reason="the delay line needs cc and iptables")
def test_a_delayed_link_has_its_rtt_and_a_dead_delay_line_cuts_the_link(tmp_path: Path) -> None:
    with ShapedLink(tag=f"8{os.getpid() % 100000}", build_dir=tmp_path) as link:
        if not link.can_delay:  # a kernel with neither sch_netem nor NFQUEUE: nothing to test here, and the benchmark says so
            pytest.skip(f"no delay can be made on this kernel: {link.no_delay}")
        assert link.delay_by in ("netem", "delay line")
        listener, port = _listener(link)
        try:
            link.shape(1000, 0)
            assert link.measured_rtt_ms(port) < 5
            link.shape(1000, 20)
            assert 19.5 <= link.measured_rtt_ms(port) < 40
            if link.delay_by != "delay line":
                return
            rules = _show(*link.wrap, "iptables", "-S")
            assert f"-A INPUT -i {link.ns_if} -j NFQUEUE --queue-num 0" in rules and "OUTPUT -o" not in rules
            stats = link.end_delay()  # the rate stays, the delay and its rules go
            assert stats["delay_us"] == 20_000 and stats["packets"] >= 2 * 21 and stats["dropped"] == 0 and stats["seconds"] > 0.4
            assert "NFQUEUE" not in _show(*link.wrap, "iptables", "-S")
            assert link.measured_rtt_ms(port) < 5
            link.shape(1000, 2)
            assert link._delay is not None and link._delay._proc is not None
            link._delay._proc.kill()  # the delay line dies mid-run: the link is cut, never left undelayed
            link._delay._proc.wait()
            with pytest.raises(OSError):
                link.measured_rtt_ms(port, count=1, timeout=1.0)
            with pytest.raises(LinkError, match="delayline exited -9"):
                link.end_delay()
        finally:
            listener.kill()
            listener.wait()
        ns = link.ns
    assert ns not in _show("ip", "netns", "list")


@needs_root
@pytest.mark.skipif(not (shutil.which("cc") and shutil.which("iptables")), reason="the delay line needs cc and iptables")
def test_a_delay_line_that_cannot_start_says_why_and_adds_no_rule(tmp_path: Path) -> None:
    from bench_lib import delay_line

    binary = delay_line.build(tmp_path)
    assert delay_line.build(tmp_path) == binary  # built once per source
    line = delay_line.DelayLine(binary, f"braid-no-such-ns-{os.getpid()}", "eth0", 1.0, 10)
    with pytest.raises(delay_line.DelayLineError, match=r"delayline did not start \(exit [1-9]\d*\): .*braid-no-such-ns"):
        line.start()
    assert line._rules == [] and line._proc is None

def _cached_s3proxy_jar() -> Path | None:
    """The s3proxy jar if a benchmark or Maven already has it: a test never downloads it."""
    from bench_lib import s3proxy

    for version in s3proxy.S3PROXY_VERSIONS:
        for jar in (ROOT / ".bench" / "s3proxy" / f"s3proxy-{version}-jar-with-dependencies.jar",
                    Path.home() / ".m2/repository/org/gaul/s3proxy" / version / f"s3proxy-{version}-jar-with-dependencies.jar"):
            if jar.exists():
                return jar
    return None


@pytest.mark.skipif(not (shutil.which("java") and shutil.which("javac") and _cached_s3proxy_jar()), reason="needs java, javac and a cached s3proxy jar")
def test_null_parts_store_counts_multipart_data_and_keeps_every_other_object(tmp_path: Path) -> None:
    import boto3
    from botocore.config import Config

    from bench_lib import s3proxy

    jar = _cached_s3proxy_jar()
    assert jar is not None
    cache = tmp_path / "work" / "s3proxy"
    cache.mkdir(parents=True)
    (cache / jar.name).symlink_to(jar)
    server = s3proxy.start_s3proxy(tmp_path / "work", null_parts=True, data_dir=tmp_path / "blobs")
    try:
        assert "braidbench.NullParts" in server.proc.args
        client = boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=s3proxy.IDENTITY, aws_secret_access_key=s3proxy.CREDENTIAL,
                              region_name=s3proxy.REGION, config=Config(request_checksum_calculation="when_required", response_checksum_validation="when_required"))
        client.create_bucket(Bucket="nullparts")
        client.put_object(Bucket="nullparts", Key="repo/config.json", Body=b'{"kept": "whole"}')
        assert client.get_object(Bucket="nullparts", Key="repo/config.json")["Body"].read() == b'{"kept": "whole"}'

        upload = client.create_multipart_upload(Bucket="nullparts", Key="repo/segment")["UploadId"]
        bodies = [b"a" * (5 * 2**20), b"b" * 12345]
        etags = [client.upload_part(Bucket="nullparts", Key="repo/segment", UploadId=upload, PartNumber=n, Body=body)["ETag"]
                 for n, body in enumerate(bodies, 1)]
        listed = client.list_parts(Bucket="nullparts", Key="repo/segment", UploadId=upload)["Parts"]
        assert [p["Size"] for p in listed] == [len(b) for b in bodies]  # the server counted every byte it received
        client.complete_multipart_upload(Bucket="nullparts", Key="repo/segment", UploadId=upload,
                                         MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]})
        total = sum(len(b) for b in bodies)
        assert client.head_object(Bucket="nullparts", Key="repo/segment")["ContentLength"] == total
        assert client.get_object(Bucket="nullparts", Key="repo/segment")["Body"].read() == b"\0" * total  # the data itself was not kept
        stored = sum(f.stat().st_size for f in (tmp_path / "blobs").rglob("*") if f.is_file())
        assert stored < 1024  # a few stubs and the config, not the 5 MiB
        # a part under S3's minimum is still refused: the sizes the server checks are the real ones
        small = client.create_multipart_upload(Bucket="nullparts", Key="repo/small")["UploadId"]
        tags = [client.upload_part(Bucket="nullparts", Key="repo/small", UploadId=small, PartNumber=n, Body=b"x" * 100)["ETag"] for n in (1, 2)]
        with pytest.raises(client.exceptions.ClientError, match="EntityTooSmall"):
            client.complete_multipart_upload(Bucket="nullparts", Key="repo/small", UploadId=small,
                                             MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in zip((1, 2), tags, strict=True)]})
    finally:
        server.stop()


def test_link_alone_defaults_to_the_issue_s_4_gib_stream_and_the_null_parts_store() -> None:
    from bench_lib.cli import build_parser, discover

    parser = build_parser(discover())
    link = parser.parse_args(["link"])
    assert (link.size, link.reps, link.link_store, link.mtu) == (4 * 2**30, 3, "null-parts", 1500)
    assert parser.parse_args(["link", "--size", "1GiB", "--reps", "1"]).size == 2**30
    assert parser.parse_args(["cloud"]).size == 512 * 2**20  # the other benchmarks keep the common default
