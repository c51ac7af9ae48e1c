"""A shaped link for the `link` benchmark: a network namespace behind a veth pair, with tc on both ends.

Everything is created by `ShapedLink` and removed when it closes (deleting
the namespace destroys the veth pair; the host end is deleted too, in case
that is asynchronous): names carry the benchmark's pid, the /30 is taken
from 10.213.0.0/16 after checking no route on the host uses it, and no
other interface, route, sysctl or qdisc is touched. Needs root (`ip`, `tc`).

Shaping: tbf at the link rate on both veth ends (the upload's data and its
ACKs), and the delay: netem of RTT/2 on each end where the kernel has
sch_netem, else (some VM kernels ship tbf and htb only) the benchmark's
user-space delay line, the whole RTT on packets arriving at the namespace
end (bench_lib.delay_line: NFQUEUE, needs iptables and a C compiler;
`delay_by` says which). With neither,
`can_delay` is False and the RTT rows are reported as skipped, not measured
at the veth's ~0.05 ms and mislabelled (`no_delay`: why).
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench_lib import delay_line


class LinkError(RuntimeError):
    pass


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LinkError(f"{' '.join(argv)}: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


@dataclass
class ShapedLink:
    tag: str = field(default_factory=lambda: str(os.getpid()))
    ns: str = ""
    host_if: str = ""
    ns_if: str = ""
    host_ip: str = ""
    ns_ip: str = ""
    can_delay: bool = False
    delay_by: str = ""  # "netem" or "delay line" (bench_lib.delay_line), when can_delay
    no_delay: str = ""  # why not, when not
    build_dir: Path | None = None  # where the delay line is compiled; without it only netem can delay
    mtu: int = 1500  # of both veth ends; the TCP payload per frame sets the ceiling a stream can reach (wire_ceiling)
    _made: list[str] = field(default_factory=list)
    _delay: delay_line.DelayLine | None = None
    _binary: Path | None = None

    def __post_init__(self) -> None:
        self.ns, self.host_if, self.ns_if = f"braidbench{self.tag}", f"bbh{self.tag}"[:15], f"bbn{self.tag}"[:15]

    @property
    def wrap(self) -> list[str]:
        """Prefix that runs a command inside the namespace."""
        return ["ip", "netns", "exec", self.ns]

    def _free_subnet(self) -> int:
        routes = _run(["ip", "-4", "route", "show", "table", "all"]) + _run(["ip", "-4", "addr", "show"])
        for third in range(int(self.tag) % 200 + 20, 256):
            if f"10.213.{third}." not in routes:
                return third
        raise LinkError("no free 10.213.X.0/30 for the benchmark's veth pair")

    def __enter__(self) -> ShapedLink:
        if os.geteuid() != 0:
            raise LinkError("the link benchmark needs root (network namespace, veth, tc)")
        third = self._free_subnet()
        self.host_ip, self.ns_ip = f"10.213.{third}.1", f"10.213.{third}.2"
        try:
            _run(["ip", "netns", "add", self.ns])
            self._made.append("ns")
            _run(["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if, "netns", self.ns])
            self._made.append("veth")
            _run(["ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if])
            _run(["ip", "link", "set", self.host_if, "mtu", str(self.mtu), "up"])
            _run(["ip", "-n", self.ns, "link", "set", self.ns_if, "mtu", str(self.mtu)])
            _run(["ip", "-n", self.ns, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if])
            _run(["ip", "-n", self.ns, "link", "set", self.ns_if, "up"])
            _run(["ip", "-n", self.ns, "link", "set", "lo", "up"])
            self.delay_by, self.no_delay = self._delay_kind()
            self.can_delay = bool(self.delay_by)
        except BaseException:
            self.close()
            raise
        return self

    def _delay_kind(self) -> tuple[str, str]:
        """("netem" | "delay line", "") if a delay can be made on this link, else ("", why not)."""
        netem = ["tc", "-n", self.ns, "qdisc", "replace", "dev", self.ns_if, "root", "netem", "delay", "1ms"]
        if subprocess.run(netem, capture_output=True).returncode == 0:
            subprocess.run(["tc", "-n", self.ns, "qdisc", "del", "dev", self.ns_if, "root"], capture_output=True)
            return "netem", ""
        missing = delay_line.available()
        if missing or self.build_dir is None:
            return "", "this kernel has no sch_netem, and " + (missing or "no build directory was given for the delay line")
        try:
            binary = delay_line.build(self.build_dir)
            with delay_line.DelayLine(binary, self.ns, self.ns_if, 1.0, 1000):  # its rule and queue can be made here
                pass
        except delay_line.DelayLineError as exc:
            return "", f"this kernel has no sch_netem, and the delay line failed: {exc}"
        self._binary = binary
        return "delay line", ""

    def shape(self, mbit: int, rtt_ms: float) -> None:
        """tbf at `mbit` on both ends, and the RTT: netem of RTT/2 on each (tbf as its child), or the delay line's RTT inbound."""
        if rtt_ms and not self.can_delay:
            raise LinkError(f"a delay cannot be made: {self.no_delay}")
        self.end_delay()
        rate_bytes = mbit * 1_000_000 // 8
        burst = max(256 * 1024, rate_bytes // 250)  # at least one timer tick's worth at HZ=250, and a GSO packet
        queue_ms = max(50, 2 * rtt_ms)
        packets = max(10_000, int(2 * rate_bytes * rtt_ms / 1000 / 1500))  # netem's limit, the delay line's too
        for prefix, dev in ((["tc"], self.host_if), (["tc", "-n", self.ns], self.ns_if)):
            subprocess.run([*prefix, "qdisc", "del", "dev", dev, "root"], capture_output=True)
            tbf = ["tbf", "rate", f"{mbit}mbit", "burst", str(burst), "latency", f"{queue_ms}ms"]
            if rtt_ms and self.delay_by == "netem":
                _run([*prefix, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay", f"{rtt_ms / 2}ms", "limit", str(packets)])
                _run([*prefix, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf])
            else:
                _run([*prefix, "qdisc", "add", "dev", dev, "root", *tbf])
        if rtt_ms and self.delay_by == "delay line":
            assert self._binary is not None
            try:
                self._delay = delay_line.DelayLine(self._binary, self.ns, self.ns_if, rtt_ms, packets).start()
            except delay_line.DelayLineError as exc:
                raise LinkError(str(exc)) from None

    def end_delay(self) -> dict[str, float]:
        """Ends a running delay line (the link keeps its rate, undelayed) and returns its counters; {} if none ran.
        A delay line that failed while running is a LinkError."""
        line, self._delay = self._delay, None
        if line is None:
            return {}
        try:
            line.close()
        except delay_line.DelayLineError as exc:
            raise LinkError(str(exc)) from None
        return line.stats

    def measured_rtt_ms(self, port: int, count: int = 21, timeout: float = 10.0) -> float:
        """The median time of `count` TCP connects to `port` in the namespace: one SYN and its SYN-ACK, so one RTT."""
        times = []
        for _ in range(count):
            started = time.perf_counter()
            with socket.create_connection((self.ns_ip, port), timeout=timeout):
                times.append(time.perf_counter() - started)
        return round(statistics.median(times) * 1000, 2)

    def close(self) -> None:
        try:
            self.end_delay()
        finally:
            self._remove()

    def _remove(self) -> None:
        if "ns" in self._made:
            subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        if "veth" in self._made:
            for _ in range(20):  # the pair goes with the namespace, possibly a moment later
                if subprocess.run(["ip", "link", "show", self.host_if], capture_output=True).returncode != 0:
                    break
                subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
                time.sleep(0.1)
        self._made.clear()

    def __exit__(self, *exc: object) -> None:
        self.close()


def wire_ceiling(mtu: int) -> float:
    """The most of a link's rate a TCP stream's payload can be: per frame, MTU less IPv4 and TCP headers
    (20 + 20 + 12 of timestamps) over the frame tc counts (MTU + the 14-byte Ethernet header).

    0.956 at MTU 1500, 0.993 at 9000. A real wire also spends 20 bytes of
    preamble and gap per frame, which tbf does not count (0.941 at 1500).
    """
    return (mtu - 52) / (mtu + 14)


@dataclass
class WireTrace:
    """Bytes a link carried, sampled (epoch seconds, cumulative bytes) while a run was going."""

    samples: list[tuple[float, int]] = field(default_factory=list)

    def between(self, start: float, end: float, rate_bytes_s: float) -> dict[str, float]:
        """Where the time in [start, end] went, in seconds.

        `wire_s`: what the bytes on the wire (headers included) take at the
        rate; `lead_s`: before the first sample interval that carried at
        least a tenth of the rate (a busy one); `tail_s`: after the last busy
        interval; `slow_s`: the rest, the link not carrying at its rate in
        between (the sender or the server not keeping up).
        """
        inside = [(t, b) for t, b in self.samples if start <= t <= end]
        if len(inside) < 2:
            return {"wire_s": 0.0, "lead_s": 0.0, "tail_s": 0.0, "slow_s": 0.0}
        steps = [(t0, t1, b1 - b0) for (t0, b0), (t1, b1) in zip(inside, inside[1:], strict=False)]
        busy = [(t0, t1) for t0, t1, n in steps if n >= 0.1 * rate_bytes_s * (t1 - t0)]
        wire_s = (inside[-1][1] - inside[0][1]) / rate_bytes_s
        lead_s = (busy[0][0] - start) if busy else end - start
        tail_s = (end - busy[-1][1]) if busy else 0.0
        return {"wire_s": wire_s, "lead_s": lead_s, "tail_s": tail_s, "slow_s": max(0.0, (end - start) - wire_s - lead_s - tail_s)}


class WireMonitor:
    """Samples a host interface's tx byte counter every `interval` seconds in a thread, while the `with` lasts."""

    def __init__(self, interface: str, interval: float = 0.1) -> None:
        self.path = f"/sys/class/net/{interface}/statistics/tx_bytes"
        self.interval = interval
        self.trace = WireTrace()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        with open(self.path) as handle:
            self.trace.samples.append((time.time(), int(handle.read())))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> WireTrace:
        self._sample()
        self._thread.start()
        return self.trace

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
