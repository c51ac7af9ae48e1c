"""A fixed delay on a link where the kernel has no sch_netem: delayline/delayline.c behind an NFQUEUE rule.

`DelayLine` builds the C program with the machine's C compiler (once per
source, into `cache`), starts it inside a network namespace, and only once
it has bound its queue adds the iptables rule that sends it every packet
arriving on the namespace end of a veth pair. Each waits `delay_ms` in the
kernel (only its id crosses to user space) and is then accepted, in order;
beyond `limit` waiting packets one is dropped, as netem does.

The whole RTT is put on the way in (the upload's data), none on the way
out (its ACKs and responses): TCP and HTTP see only the sum, and the delay
line then handles half the packets (its CPU is the host's, which a real
link's is not).

Closing removes the rule and stops the program, whose counters (`stats`:
packets, dropped, most_waiting, latest_release_us: the most a release came
after its time, late_1ms: releases over 1 ms late, cpu_s over seconds, and
realtime: whether it ran SCHED_FIFO) say how exact the delay was and what it
took from the host's cores. If the program dies, the queue has no listener
and the kernel drops the link's packets: a run then fails, it is never
measured undelayed.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "delayline" / "delayline.c"
QUEUE = 0  # NFQUEUE numbers are per network namespace: the benchmark's own namespace holds only this one


class DelayLineError(RuntimeError):
    pass


def available() -> str:
    """Empty if a delay line can be made here, else what is missing."""
    missing = [tool for tool in ("cc", "iptables") if not shutil.which(tool)]
    return f"not on PATH: {', '.join(missing)} (a C compiler, and iptables for its NFQUEUE rule)" if missing else ""


def build(cache: Path) -> Path:
    """delayline.c compiled with `cc -O2` into `cache`, once per source."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    binary = cache / f"delayline-{digest}"
    if binary.exists():
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(".partial")
    proc = subprocess.run(["cc", "-O2", "-Wall", "-o", str(partial), str(SOURCE)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise DelayLineError(f"cc {SOURCE.name} failed: {(proc.stdout + proc.stderr).strip().splitlines()[-3:]}")
    partial.rename(binary)
    return binary


class DelayLine:
    """`delay_ms` on every packet arriving on `interface` inside namespace `ns`, while open."""

    def __init__(self, binary: Path, ns: str, interface: str, delay_ms: float, limit: int) -> None:
        self.binary, self.ns, self.interface = binary, ns, interface
        self.delay_us, self.limit = round(delay_ms * 1000), limit
        self.stats: dict[str, float] = {}
        self._proc: subprocess.Popen | None = None
        self._rules: list[list[str]] = []

    def _iptables(self, action: str, rule: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.ns, "iptables", "-w", action, *rule], capture_output=True, text=True)

    def __enter__(self) -> DelayLine:
        return self.start()

    def start(self) -> DelayLine:
        """The program bound to its queue, then the rule that sends it the interface's arriving packets."""
        argv = ["ip", "netns", "exec", self.ns, str(self.binary), str(QUEUE), str(self.delay_us), str(self.limit)]
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            ready = self._proc.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
            if ready:
                rule = ["INPUT", "-i", self.interface, "-j", "NFQUEUE", "--queue-num", str(QUEUE)]
                proc = self._iptables("-A", rule)
                if proc.returncode != 0:
                    raise DelayLineError(f"iptables -A {' '.join(rule)}: {(proc.stderr or proc.stdout).strip()}")
                self._rules.append(rule)
        except BaseException:
            self._stop()
            raise
        if not ready:
            code, err = self._stop()
            raise DelayLineError(f"delayline did not start (exit {code}): {err.strip()}")
        return self

    def close(self) -> None:
        """The rule first (no packet is queued to a stopped listener), then the program; its counters into `stats`.
        A program that had exited with an error (it died while running) is a DelayLineError."""
        code, err = self._stop()
        if code:
            raise DelayLineError(f"delayline exited {code}: {err.strip()}")

    def _stop(self) -> tuple[int, str]:
        """Removes the rule and stops the program; its exit status (0 if none ran) and what it wrote on stderr."""
        while self._rules:
            self._iptables("-D", self._rules.pop())
        proc, self._proc = self._proc, None
        if proc is None:
            return 0, ""
        if proc.poll() is None:
            proc.terminate()
        try:
            _, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        self.stats = parse_stats(err)
        return proc.returncode, err

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_stats(text: str) -> dict[str, float]:
    """The counters of delayline's last line (`delayline: queue 0 delay_us 500 packets 12 ...`)."""
    for line in reversed(text.splitlines()):
        words = line.split()
        if words[:1] == ["delayline:"] and len(words) % 2 == 1:
            return {key: float(value) for key, value in zip(words[1::2], words[2::2], strict=True) if key != "queue"}
    return {}
