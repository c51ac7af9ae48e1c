"""A command Braid runs for the user: a backup's producer or a restore's consumer.

Braid runs the database tool itself (rather than sitting at the end of a
shell pipe) because only the process that started a command learns how it
ended: a pipe closes the same way whether its writer finished or died. This
module owns what both directions share:

- starting it, with "command not found" as a typed error rather than a trace;
- its stderr, passed through to Braid's own stderr as it comes (progress
  lines included), while the tail is kept, so a failure can quote the last
  thing the tool said;
- signals: SIGINT, SIGTERM and SIGHUP that reach Braid are passed on to it
  (then Braid's own handler runs: braid.cli.main turns them into a clean
  exit 130); a signal Braid ignores (nohup) is not passed on;
- its end: the exit status or the signal that killed it, in words, and a
  stop that asks (SIGTERM) before it insists (SIGKILL);
- Braid's end: on Linux the command is started with PR_SET_PDEATHSIG
  (SIGKILL), so a Braid killed with SIGKILL (or by the OOM killer) takes it
  along instead of letting its pipes close: a consumer must never read a
  cut stream's end as the end of the backup. Processes the command itself
  starts are not covered: a consumer should be one process, or exec it.

Only the command's own name goes into messages and manifests, never its
arguments: command lines carry passwords (`mysqldump -pSECRET`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import IO, Any

from braid.errors import ProducerError

__all__ = ["Child", "program_name"]

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_TAIL_BYTES = 8192
_LAST_LINE_CHARS = 300
_HINT = re.compile(r"^(\S+: )?hint: ", re.IGNORECASE)  # "pg_basebackup: hint: ...", "HINT:  ..."
STOP_GRACE_SECONDS = 10.0


def program_name(argv: Sequence[str]) -> str:
    """What messages and manifests call the command: its program's base name."""
    return os.path.basename(argv[0]) or argv[0]


class Child:
    """One running command; see the module docstring. Start it from the main thread (signals)."""

    def __init__(
        self, role: str, argv: Sequence[str], *, stdin: int | None = None, stdout: int | None = None, echo: Callable[[bytes], None] | None = None
    ) -> None:
        """`role` names it in messages ("producer", "consumer"); `stdin`/`stdout` are
        file descriptors or subprocess.PIPE, None to share Braid's. `echo` shows the
        command's stderr (a live progress line draws it beside its own); default: our stderr."""
        self.role = role
        self._echo = echo
        self.name = program_name(argv)
        self._tail = bytearray()
        self._tail_lock = threading.Lock()
        self._forwarded = False
        self._previous: dict[int, Any] = {}
        try:
            self.proc = subprocess.Popen(list(argv), stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, preexec_fn=_die_with_parent())
        except FileNotFoundError:
            raise ProducerError(f"the {role} failed: cannot run {self.name}: command not found") from None
        except PermissionError:
            raise ProducerError(f"the {role} failed: cannot run {self.name}: permission denied") from None
        except OSError as exc:
            raise ProducerError(f"the {role} failed: cannot run {self.name}: {exc.strerror or exc}") from None
        assert self.proc.stderr is not None
        self._stderr: IO[bytes] = self.proc.stderr
        self._pump = threading.Thread(target=self._pass_stderr, name=f"braid-{role}-stderr", daemon=True)
        self._pump.start()
        self._forward_signals()

    # -- stderr ------------------------------------------------------------------
    def _pass_stderr(self) -> None:
        """Copy the command's stderr to ours as it comes; keep the tail for `last_line`."""
        fd = self._stderr.fileno()
        passing = True
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                return
            if not data:
                return
            with self._tail_lock:
                self._tail += data
                del self._tail[:-_TAIL_BYTES]
            if passing:
                try:
                    if self._echo is not None:
                        self._echo(data)
                    else:
                        _write_all(2, data)
                except OSError:
                    passing = False  # our stderr is gone: keep draining, or the command blocks on a full pipe

    def last_line(self) -> str | None:
        """The last non-blank line the command wrote on stderr (progress `\\r` updates count as lines).

        Trailing hint lines are passed over: PostgreSQL's tools end a failure
        with `pg_basebackup: hint: Try "pg_basebackup --help" ...` after the
        line that says what went wrong, and the user needs the latter; so are
        whitespace-indented continuation lines (libpq's), for the line they continue.
        """
        with self._tail_lock:
            text = bytes(self._tail).decode(errors="replace")
        lines = [line.rstrip() for line in text.replace("\r", "\n").split("\n")]
        lines = [line for line in lines if line.strip()]
        # A whitespace-indented line continues the one above it (libpq's "\tIs the server running locally
        # ...?" under "connection to server on socket ... port 5999 failed"): the informative line is that one.
        while len(lines) > 1 and (_HINT.match(lines[-1].strip()) or lines[-1][:1].isspace()):
            lines.pop()
        if not lines:
            return None
        last = lines[-1].strip()
        return last if len(last) <= _LAST_LINE_CHARS else last[: _LAST_LINE_CHARS - 3] + "..."

    # -- signals -----------------------------------------------------------------
    def _forward_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers live in the main thread; a library caller elsewhere keeps its own
        for signum in _FORWARDED:
            previous = signal.getsignal(signum)
            if previous in (signal.SIG_IGN, None):
                continue  # ignored by Braid (nohup): not ours to pass on
            self._previous[signum] = previous
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.send(signum)
        self._forwarded = True
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)
        else:  # SIG_DFL: stop as an interrupt, so the caller still cleans up
            raise KeyboardInterrupt

    def _restore_signals(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def send(self, signum: int) -> None:
        """Send `signum` unless the command already ended (never to a reaped pid)."""
        if self.proc.returncode is None:
            try:
                self.proc.send_signal(signum)
            except ProcessLookupError:
                pass

    # -- the end -----------------------------------------------------------------
    def wait(self) -> int:
        """Its exit status (negative: the signal that killed it), once it ended and its stderr drained."""
        code = self.proc.wait()
        self._pump.join(2.0)  # a grandchild may hold stderr open; the tail so far is what we have
        return code

    def await_end(self) -> bool:
        """Block until it ended, without reaping it (for a watcher thread: `wait` still gets
        the status, and no signal can reach a reused pid); True if it exited 0."""
        try:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # already reaped by `wait`
            return self.proc.returncode == 0
        return info is not None and info.si_code == os.CLD_EXITED and info.si_status == 0

    def ended(self) -> bool:
        return self.proc.poll() is not None

    def describe(self, code: int, detail: str = "") -> str:
        """"NAME exited with status 2" / "NAME was killed by signal 9 (SIGKILL)", `detail`, then the last stderr line."""
        if code < 0:
            try:
                what = f"was killed by signal {-code} ({signal.Signals(-code).name})"
            except ValueError:
                what = f"was killed by signal {-code}"
        else:
            what = f"exited with status {code}"
        line = self.last_line()
        said = f'its last stderr line: "{line}"' if line else "nothing on stderr"
        return f"{self.name} {what}{detail} ({said})"

    def failure(self, detail: str, consequence: str) -> ProducerError:
        """The error for a user: `the producer failed: <detail>; <consequence>`."""
        return ProducerError(f"the {self.role} failed: {detail}; {consequence}")

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """End it if it still runs: SIGTERM (unless a signal was just passed on), then SIGKILL after `grace`."""
        try:
            if self.proc.poll() is None:
                if not self._forwarded:
                    self.send(signal.SIGTERM)
                try:
                    self.proc.wait(grace)
                except subprocess.TimeoutExpired:
                    self.send(signal.SIGKILL)
                    self.proc.wait()
            self._pump.join(2.0)
        finally:
            if not self._pump.is_alive():  # else a grandchild holds it: closing under a read could hit a reused fd
                self._stderr.close()
            self._restore_signals()


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """What the command runs before exec: ask the kernel for SIGKILL when Braid dies (Linux); None elsewhere.

    Resolved here, in the parent, so the child between fork and exec makes
    one foreign call and no allocation or import. PDEATHSIG fires when the
    thread that forked ends: commands are started from the main thread. If
    Braid died before the call took effect, the command is not run at all.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None  # a thread's end would kill it: only the main thread's commands are tied to Braid
    import ctypes  # here: only a command Braid runs pays for it

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if os.getppid() != parent:  # Braid was gone before the request took effect
            os._exit(128 + sigkill)

    return preexec


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
