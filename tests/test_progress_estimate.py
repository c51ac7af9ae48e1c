"""The live line of a command's stream (issue 25, F7/F8): a `waiting` phase until the first byte, then
`~%` and `~ETA` estimated from the previous backup of the same name or --expected-size."""

from __future__ import annotations

from pathlib import Path

from braid.cli.progress_view import ProgressView
from conftest import run_braid

MiB = 2**20


def reading(view: ProgressView) -> None:
    view.update({"event": "phase", "phase": "reading", "backup": "pg@X", "total_bytes": None, "total_chunks": None}, 0.0)


def test_waiting_until_the_first_byte() -> None:
    view = ProgressView(0.0)
    reading(view)
    assert view.line(42.0) == "waiting for the producer's first byte (0:00:42)  0:00:42  pg@X"
    view.update({"event": "chunk", "bytes": 16 * MiB, "chunks": 1}, 43.0)
    assert view.line(43.0).startswith("reading  16 MiB  ")


def test_an_estimate_gives_approximate_percent_and_eta() -> None:
    view = ProgressView(0.0)
    view.estimate = 1000 * MiB
    reading(view)
    view.update({"event": "chunk", "bytes": 450 * MiB, "chunks": 28, "ratio": 0.5}, 10.0)
    line = view.line(10.0)
    assert line.startswith("reading  ~45% ") and "450 MiB/~1000 MiB" in line and "~ETA 0:00:12" in line
    view.update({"event": "chunk", "bytes": 1200 * MiB, "chunks": 75}, 20.0)  # bigger than last time: never 100% before the end
    assert "~99%" in view.line(20.0)
    # Without an estimate: no % and no ETA, as before.
    plain = ProgressView(0.0)
    reading(plain)
    plain.update({"event": "chunk", "bytes": 450 * MiB, "chunks": 28}, 10.0)
    assert "%" not in plain.line(10.0) and "ETA" not in plain.line(10.0)


def test_expected_size_is_checked(repo: Path) -> None:
    bad = run_braid("backup", "--repo", str(repo), "--name", "pg", "--expected-size", "lots", "--", "echo", "x")
    assert bad.code == 2 and "invalid size 'lots'" in bad.stderr
    ok = run_braid("backup", "--repo", str(repo), "--name", "pg", "--expected-size", "1MiB", "--", "echo", "rows")
    assert ok.code == 0, ok.stderr
    again = run_braid("backup", "--repo", str(repo), "--name", "pg", "--", "echo", "rows")  # estimated from the first
    assert again.code == 0, again.stderr


def test_a_producers_carriage_return_progress_gets_a_line_of_its_own() -> None:
    """pg_basebackup -P's `\\r` updates under the live line: drawn on their own line, never over Braid's (F6)."""
    import io

    from braid.cli.progress import Progress

    stream = io.StringIO()
    with Progress("bar", stream=stream) as progress:
        progress({"event": "phase", "backup": "pg@X", "phase": "reading", "total_bytes": None, "total_chunks": None})
        progress.echo(b"197326/261308 kB (75%), 0/1 tablespace\r")
        progress.echo(b"270887/270887 kB (100%), 0/1 ")
        progress.echo(b"tablespace\r")
        assert progress._producer_line == "270887/270887 kB (100%), 0/1 tablespace"
        drawn = progress._renderable()
        assert [str(part) for part in drawn.renderables][0] == "270887/270887 kB (100%), 0/1 tablespace"
        assert str(drawn.renderables[1]).startswith("waiting for the producer's first byte")
        progress.echo(b"\npg_basebackup: base backup completed\n")
        assert progress._producer_line == ""
    assert "pg_basebackup: base backup completed" in stream.getvalue()


def test_without_a_live_line_the_producers_stderr_passes_through(capfd: object) -> None:
    import io

    from braid.cli.progress import Progress

    with Progress("json", stream=io.StringIO()) as progress:
        progress.echo(b"12/34 kB (35%)\r")
    assert capfd.readouterr().err == "12/34 kB (35%)\r"  # type: ignore[attr-defined]
