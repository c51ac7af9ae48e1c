"""A shaped link for the `link` benchmark: a network namespace behind a veth pair, with tc on both ends.

Everything is created by `ShapedLink` and removed when it closes (deleting
the namespace destroys the veth pair; the host end is deleted too, in case
that is asynchronous): names carry the benchmark's pid, the /30 is taken
from 10.213.0.0/16 after checking no route on the host uses it, and no
other interface, route, sysctl or qdisc is touched. Needs root (`ip`, `tc`).

Shaping: tbf at the link rate on both veth ends (the upload's data and its
ACKs), and netem delay of RTT/2 on each end where the kernel has sch_netem.
Without it (some VM kernels ship tbf and htb only) the delay cannot be
made: `can_delay` is False and the RTT rows are reported as skipped, not
measured at the veth's ~0.05 ms and mislabelled.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field


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
    _made: list[str] = field(default_factory=list)

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
            _run(["ip", "link", "set", self.host_if, "up"])
            _run(["ip", "-n", self.ns, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if])
            _run(["ip", "-n", self.ns, "link", "set", self.ns_if, "up"])
            _run(["ip", "-n", self.ns, "link", "set", "lo", "up"])
            self.can_delay = subprocess.run(
                ["tc", "-n", self.ns, "qdisc", "replace", "dev", self.ns_if, "root", "netem", "delay", "1ms"], capture_output=True
            ).returncode == 0
            subprocess.run(["tc", "-n", self.ns, "qdisc", "del", "dev", self.ns_if, "root"], capture_output=True)
        except BaseException:
            self.close()
            raise
        return self

    def shape(self, mbit: int, rtt_ms: float) -> None:
        """tbf at `mbit` on both ends (as netem's child when delaying RTT/2 on each)."""
        if rtt_ms and not self.can_delay:
            raise LinkError("the kernel has no sch_netem: a delay cannot be made")
        rate_bytes = mbit * 1_000_000 // 8
        burst = max(256 * 1024, rate_bytes // 250)  # at least one timer tick's worth at HZ=250, and a GSO packet
        queue_ms = max(50, 2 * rtt_ms)
        for prefix, dev in ((["tc"], self.host_if), (["tc", "-n", self.ns], self.ns_if)):
            subprocess.run([*prefix, "qdisc", "del", "dev", dev, "root"], capture_output=True)
            tbf = ["tbf", "rate", f"{mbit}mbit", "burst", str(burst), "latency", f"{queue_ms}ms"]
            if rtt_ms:
                packets = max(10_000, int(2 * rate_bytes * rtt_ms / 1000 / 1500))
                _run([*prefix, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay", f"{rtt_ms / 2}ms", "limit", str(packets)])
                _run([*prefix, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf])
            else:
                _run([*prefix, "qdisc", "add", "dev", dev, "root", *tbf])

    def close(self) -> None:
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
