"""restic's `forget --keep-*` rules against a fixed calendar of backups, and stored per-name policies.

The rules (braid.ops.retention.select_kept) are checked against a reference
written here independently, the obvious way: group the backups by UTC
calendar period, take the newest of each of the newest N periods. Then the
real CLI: flag validation, prune on a calendar of real backups, and
policies stored in the repository.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from braid.cli.compose import open_key_service, open_repository
from braid.engine.chunk_worker import ChunkTask, store_chunk
from braid.engine.finalize import InputRecord, finalize_backup
from braid.errors import IntegrityError, UsageError
from braid.format.chunk import ChunkCodec
from braid.format.ids import BackupRef
from braid.format.keys import encryption_context
from braid.format.policy import Duration, KeepRules, parse_policy
from braid.format.timestamps import utc_now
from braid.ops.retention import RetentionPolicy, select_kept
from braid.pipeline.maintenance import policy_from_event
from conftest import run_braid

# --- the reference ------------------------------------------------------------

PERIODS = {
    "keep_hourly": lambda t: t.strftime("%Y-%m-%d %H"),
    "keep_daily": lambda t: t.strftime("%Y-%m-%d"),
    "keep_weekly": lambda t: "{:04d}-W{:02d}".format(*t.isocalendar()[:2]),
    "keep_monthly": lambda t: t.strftime("%Y-%m"),
    "keep_yearly": lambda t: t.strftime("%Y"),
}


def months_back(moment: datetime, years: int, months: int, days: int, hours: int) -> datetime:
    """Go's time.AddDate(-years, -months, -days) then -hours: an overflowing day rolls into the next month."""
    year, month = moment.year - years, moment.month - months
    while month < 1:
        month += 12
        year -= 1
    return moment.replace(year=year, month=month, day=1) + timedelta(days=moment.day - 1 - days) - timedelta(hours=hours)


def reference(times: list[datetime], rules: KeepRules, now: datetime) -> set[datetime]:
    """The backups (by start time, all distinct) the rules keep."""
    newest_first = sorted(times, reverse=True)
    kept: set[datetime] = set()
    if rules.keep_last:
        kept.update(newest_first[: rules.keep_last])
    for rule, period in PERIODS.items():
        count = getattr(rules, rule)
        if count:
            groups: dict[str, list[datetime]] = {}
            for t in times:
                groups.setdefault(period(t), []).append(t)
            for name in sorted(groups, reverse=True)[:count]:
                kept.add(max(groups[name]))
    if rules.keep_within:
        w = rules.keep_within
        deadline = months_back(newest_first[0], w.years, w.months, w.days, w.hours)
        kept.update(t for t in times if t > deadline)
    if rules.keep_days is not None:
        kept.update(t for t in times if now - t <= timedelta(days=rules.keep_days))
    return kept


def kept_by_braid(times: list[datetime], rules: KeepRules, now: datetime | None = None) -> set[datetime]:
    newest_first = sorted(times, reverse=True)
    flags = select_kept(newest_first, rules, now or newest_first[0])
    return {t for t, keep in zip(newest_first, flags, strict=True) if keep}


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# --- fixed calendars (restic's documented behaviour) -----------------------------

# restic's forum/doc example: one per day except May 3rd, two on May 2nd.
MAY = [at("2024-05-01T08:00"), at("2024-05-02T08:00"), at("2024-05-02T11:00"), at("2024-05-04T09:00"), at("2024-05-05T10:00")]


def test_keep_daily_counts_days_that_have_backups_from_the_newest() -> None:
    assert kept_by_braid(MAY, KeepRules(keep_daily=4)) == {MAY[0], MAY[2], MAY[3], MAY[4]}
    # Counted from the newest backup, not from now: a month later the same four are kept.
    assert kept_by_braid(MAY, KeepRules(keep_daily=4), at("2024-06-05T00:00")) == {MAY[0], MAY[2], MAY[3], MAY[4]}
    assert kept_by_braid(MAY, KeepRules(keep_daily=2)) == {MAY[3], MAY[4]}


def test_keep_within_counts_from_the_newest_backup() -> None:
    # 4 days before May 5th 10:00 is May 1st 10:00: the 8 a.m. backup is older.
    assert kept_by_braid(MAY, KeepRules(keep_within=Duration.parse("4d"))) == set(MAY[1:])
    assert kept_by_braid(MAY, KeepRules(keep_within=Duration.parse("4d2h"))) == set(MAY[1:])  # exactly at the deadline: not within
    assert kept_by_braid(MAY, KeepRules(keep_within=Duration.parse("4d3h"))) == set(MAY)
    assert kept_by_braid(MAY, KeepRules(keep_within=Duration.parse("1h"))) == {MAY[4]}


def test_keep_within_months_roll_over_as_restic_does() -> None:
    # Mar 31 minus 1 month is "Feb 31", i.e. Mar 2 (2024 is a leap year): Mar 2 00:00 itself is not after it.
    times = [at("2024-03-31T00:00"), at("2024-03-02T00:00"), at("2024-03-02T00:01"), at("2024-02-29T12:00")]
    assert kept_by_braid(times, KeepRules(keep_within=Duration.parse("1m"))) == {times[0], times[2]}


def test_weekly_uses_iso_weeks_across_the_new_year() -> None:
    # 2020-12-31 (Thu) and 2021-01-03 (Sun) are both ISO week 53 of 2020; 2021-01-04 starts week 1 of 2021.
    times = [at("2020-12-28T01:00"), at("2020-12-31T01:00"), at("2021-01-03T01:00"), at("2021-01-04T01:00"), at("2021-01-10T01:00")]
    assert kept_by_braid(times, KeepRules(keep_weekly=2)) == {times[2], times[4]}
    assert kept_by_braid(times, KeepRules(keep_weekly=3)) == {times[2], times[4]}  # only two weeks have backups
    assert kept_by_braid(times, KeepRules(keep_yearly=5)) == {times[1], times[4]}


def test_rules_are_a_union_and_a_backup_kept_twice_counts_once() -> None:
    daily = [at("2024-01-01T00:00") + timedelta(days=d, hours=h) for d in range(60) for h in (1, 13)]
    rules = KeepRules(keep_last=3, keep_daily=7, keep_monthly=3)
    kept = kept_by_braid(daily, rules)
    newest = sorted(daily, reverse=True)
    expected = set(newest[:3]) | {t for t in daily if t.hour == 13 and t >= at("2024-02-23T00:00")}
    expected |= {at("2024-02-29T13:00"), at("2024-01-31T13:00")}  # newest of February (also a daily) and of January
    assert kept == expected and len(kept) == 1 + 7 + 1  # Feb 29th 01:00, seven days, January


def test_hourly_buckets_are_utc() -> None:
    east = datetime(2024, 5, 1, 10, 30, tzinfo=UTC).astimezone(ZoneInfo("Asia/Tokyo"))  # 19:30 in Tokyo
    times = [at("2024-05-01T10:05"), east, at("2024-05-01T11:00")]
    assert kept_by_braid(times, KeepRules(keep_hourly=2)) == {east, times[2]}


# --- properties against the reference ---------------------------------------------

calendars = st.lists(
    st.datetimes(min_value=datetime(2018, 1, 1), max_value=datetime(2026, 12, 31), timezones=st.just(UTC)).map(
        lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000)  # ids keep milliseconds
    ),
    min_size=1,
    max_size=60,
    unique=True,
)
counts = st.one_of(st.none(), st.integers(1, 12))
durations = st.builds(Duration, st.integers(0, 3), st.integers(0, 14), st.integers(0, 40), st.integers(0, 50)).filter(
    lambda d: not d.is_zero
)
rule_sets = st.builds(
    KeepRules,
    keep_last=counts,
    keep_hourly=counts,
    keep_daily=counts,
    keep_weekly=counts,
    keep_monthly=counts,
    keep_yearly=counts,
    keep_within=st.one_of(st.none(), durations),
    keep_days=st.one_of(st.none(), st.floats(0, 4000)),
)


@settings(max_examples=400, deadline=None)
@given(calendars, rule_sets, st.integers(0, 4000))
def test_rules_match_the_reference(times: list[datetime], rules: KeepRules, days_later: int) -> None:
    now = max(times) + timedelta(days=days_later)
    assert kept_by_braid(times, rules, now) == reference(times, rules, now)


@settings(max_examples=100, deadline=None)
@given(calendars, st.sampled_from(sorted(PERIODS)), st.integers(1, 12))
def test_each_period_rule_keeps_at_most_n_one_per_period(times: list[datetime], rule: str, count: int) -> None:
    kept = kept_by_braid(times, KeepRules(**{rule: count}))
    periods = [PERIODS[rule](t) for t in kept]
    assert len(kept) == min(count, len({PERIODS[rule](t) for t in times})) and len(set(periods)) == len(periods)
    assert max(times) in kept


@settings(max_examples=100, deadline=None)
@given(
    st.builds(Duration, st.integers(0, 99), st.integers(0, 99), st.integers(0, 999), st.integers(0, 999), st.integers(0, 999)).filter(
        lambda d: not d.is_zero
    )
)
def test_duration_text_round_trips(duration: Duration) -> None:
    assert Duration.parse(str(duration)) == duration
    assert Duration.parse(str(duration), user=True) == duration


def test_minutes_are_min_months_are_mo_and_a_bare_m_from_a_user_is_refused_with_both_spellings() -> None:
    assert Duration.parse("30min", user=True) == Duration(minutes=30)
    assert Duration.parse("1y2mo3d4h5min", user=True) == Duration(1, 2, 3, 4, 5)
    with pytest.raises(UsageError) as refused:
        Duration.parse("30m", user=True)
    assert str(refused.value) == "--keep-within '30m': a bare m is ambiguous; write 30min for minutes or 30mo for months"
    assert Duration.parse("30m") == Duration(months=30)  # a policy stored before `mo` keeps its meaning
    newest = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    assert Duration(minutes=30).deadline(newest) == datetime(2026, 5, 1, 11, 30, tzinfo=UTC)


def test_the_cli_refuses_keep_within_30m_with_exit_2_and_accepts_30min(repo: Path) -> None:
    refused = run_braid("prune", "--repo", str(repo), "--keep-within", "30m", "--dry-run")
    assert refused.code == 2
    assert "a bare m is ambiguous; write 30min for minutes or 30mo for months" in refused.stderr
    assert run_braid("prune", "--repo", str(repo), "--keep-within", "30min", "--dry-run").code == 0


# --- policy values --------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "7", "d", "7x", "1d1d", "-1d", "0d", "0y0m", "0min", "1m1mo", "1.5d", "7d ", "2h1d0", "99999999y"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match="--keep-within"):
        Duration.parse(text)


def test_stored_policy_is_validated_on_read() -> None:
    good = {"version": 1, "name": "pg", "rules": {"keep_daily": 7, "keep_within": "1y"}}
    assert parse_policy(json.dumps(good).encode(), "pg", "x") == KeepRules(keep_daily=7, keep_within=Duration(years=1))
    for bad in (
        b"{",
        json.dumps({**good, "name": "other"}).encode(),
        json.dumps({**good, "rules": {}}).encode(),
        json.dumps({**good, "rules": {"keep_daily": 0}}).encode(),
        json.dumps({**good, "rules": {"keep_daily": "7"}}).encode(),
        json.dumps({**good, "rules": {"keep_daily": True}}).encode(),
        json.dumps({**good, "rules": {"keep_forever": 1}}).encode(),
        json.dumps({**good, "rules": {"keep_within": "soon"}}).encode(),
        json.dumps({**good, "version": 2}).encode(),
    ):
        with pytest.raises(IntegrityError, match="stored retention policy x is not valid"):
            parse_policy(bad, "pg", "x")


def test_schedule_event_rules_and_the_stored_default() -> None:
    assert policy_from_event({"keep_daily": 7, "keep_monthly": "12", "keep_within": "1y"}) == RetentionPolicy.of(
        keep_daily=7, keep_monthly=12, keep_within=Duration(years=1)
    )
    assert policy_from_event({"sample_percent": 10}) == RetentionPolicy.of(stored=True)
    with pytest.raises(UsageError, match="--keep-weekly must be at least 1"):
        policy_from_event({"keep_weekly": 0})
    with pytest.raises(UsageError, match="--keep-within"):
        policy_from_event({"keep_within": 7})


# --- the CLI on a calendar of real backups ----------------------------------------


def backup_at(repo: Path, name: str, when: datetime) -> str:
    """A real, complete backup whose id says it started at `when` (one small chunk)."""
    repository = open_repository(str(repo))
    keys = open_key_service(repository, None)
    ref = BackupRef.new(name, now=when)
    key, wrapped = keys.generate_data_key(encryption_context(repository.config.id, str(ref)))
    entry = store_chunk(ChunkCodec(key, 3), repository.store, ref, ChunkTask(0, 0, 0), b"r" * 4096)
    finalize_backup(
        repository.store, ref=ref, repository_id=repository.config.id, key=key, wrapped=wrapped, chunk_size=4096,
        inputs=[InputRecord(0, "stdin", 4096)], entries=[entry], level=3, created=utc_now(), timings={}, engine="local",
    )
    return str(ref)


def listed(repo: Path) -> list[str]:
    return sorted(row["backup"] for row in json.loads(run_braid("list", "--repo", str(repo), "--json").out))


@pytest.fixture
def calendar(repo: Path) -> dict[str, list[str]]:
    """pg: one backup a day for 10 days in May 2024, at 02:00 and 14:00; logs: three in 2023."""
    pg = [backup_at(repo, "pg", at("2024-05-01T02:00") + timedelta(days=d, hours=h)) for d in range(10) for h in (0, 12)]
    logs = [backup_at(repo, "logs", at(f"2023-0{m}-01T00:00")) for m in (1, 2, 3)]
    return {"pg": pg, "logs": logs}


def test_prune_keep_daily_on_a_calendar(repo: Path, calendar: dict[str, list[str]]) -> None:
    dry = run_braid("prune", "--repo", str(repo), "--keep-daily", "3", "--keep-monthly", "1", "--dry-run", "--json")
    assert dry.code == 0, dry.stderr
    plan = json.loads(dry.out)
    assert sorted(plan["keep"]) == sorted(calendar["pg"][-5::2] + calendar["logs"])  # logs: three days, all kept
    assert len(listed(repo)) == 23

    result = run_braid("prune", "--repo", str(repo), "--name", "pg", "--keep-daily", "3", "--json")
    assert result.code == 0, result.stderr
    assert sorted(json.loads(result.out)["forget"]) == sorted(set(calendar["pg"]) - set(calendar["pg"][-5::2]))
    assert listed(repo) == sorted(calendar["pg"][-5::2] + calendar["logs"])  # --name: logs untouched
    assert run_braid("verify", "--repo", str(repo), "--all", "--deep").code == 0


def test_keep_within_keeps_from_the_newest_backup_not_from_now(repo: Path, calendar: dict[str, list[str]]) -> None:
    result = run_braid("prune", "--repo", str(repo), "--name", "logs", "--keep-within", "1mo", "--json")
    assert result.code == 0, result.stderr
    # Mar 1st minus 1 month is Feb 1st 00:00: as in restic only backups strictly after it are within.
    assert sorted(json.loads(result.out)["forget"]) == calendar["logs"][:2]
    assert listed(repo) == sorted(calendar["pg"] + calendar["logs"][2:])


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--keep-daily", "0", "'0' must be at least 1"),
        ("--keep-weekly", "-2", "'-2' must be at least 1"),
        ("--keep-monthly", "many", "'many' is not a whole number"),
        ("--keep-yearly", "1.5", "'1.5' is not a whole number"),
        ("--keep-hourly", "", "'' is not a whole number"),
        ("--keep-within", "7", "must be a duration such as 2y5mo7d3h"),
        ("--keep-within", "0d", "must be more than 0"),
        ("--keep-within", "3w", "must be a duration"),
        ("--name", "../etc", "invalid backup name"),
    ],
)
def test_bad_flags_exit_2(repo: Path, flag: str, value: str, message: str) -> None:
    result = run_braid("prune", "--repo", str(repo), f"{flag}={value}")
    assert result.code == 2 and message in result.stderr and flag in result.stderr, result.stderr


def test_policy_flags_need_a_name_and_a_rule(repo: Path) -> None:
    result = run_braid("prune", "--repo", str(repo), "--keep-daily", "7", "--save-policy")
    assert result.code == 2 and "--save-policy needs --name NAME" in result.stderr
    result = run_braid("prune", "--repo", str(repo), "--name", "pg", "--save-policy")
    assert result.code == 2 and "needs --keep-last N" in result.stderr
    result = run_braid("prune", "--repo", str(repo), "--show-policy", "--keep-daily", "1")
    assert result.code == 2 and "take no --keep-* rule" in result.stderr
    result = run_braid("prune", "--repo", str(repo), "--show-policy", "--save-policy")
    assert result.code == 2 and "not allowed with argument" in result.stderr


def test_stored_policy_round_trip_and_prune_with_it(repo: Path, calendar: dict[str, list[str]]) -> None:
    saved = run_braid("prune", "--repo", str(repo), "--name", "pg", "--keep-daily", "2", "--keep-within", "1d12h", "--save-policy")
    assert saved.code == 0, saved.stderr
    assert saved.out.strip() == "pg: --keep-daily 2 --keep-within 1d12h" and "saved as policies/pg.json" in saved.stderr
    assert len(listed(repo)) == 23  # saving prunes nothing
    assert json.loads((repo / "policies" / "pg.json").read_text()) == {
        "version": 1, "name": "pg", "rules": {"keep_daily": 2, "keep_within": "1d12h"}
    }
    shown = run_braid("prune", "--repo", str(repo), "--show-policy", "--json")
    assert shown.code == 0 and json.loads(shown.out) == {"schema_version": 1, "policies": {"pg": {"keep_daily": 2, "keep_within": "1d12h"}}}

    result = run_braid("prune", "--repo", str(repo))  # no rules: the stored ones, per name
    assert result.code == 0, result.stderr
    assert "left logs alone: no stored policy" in result.out
    # Newest is May 10th 14:00: within 1d12h are May 9th 14:00 onwards (strictly after 02:00); daily 2 adds May 9th's newest.
    assert listed(repo) == sorted(calendar["pg"][-3:] + calendar["logs"])

    again = run_braid("prune", "--repo", str(repo), "--json")
    assert json.loads(again.out)["unmanaged"] == ["logs"] and json.loads(again.out)["forget"] == []
    assert run_braid("prune", "--repo", str(repo), "--name", "pg", "--delete-policy").out.strip() == "removed the stored policy of pg"
    assert run_braid("prune", "--repo", str(repo), "--show-policy").stderr.startswith("no stored retention policy")
    assert json.loads(run_braid("prune", "--repo", str(repo), "--name", "pg", "--delete-policy", "--json").out) == {"schema_version": 1, "name": "pg", "deleted": False}


def test_without_any_policy_nothing_is_removed(repo: Path, calendar: dict[str, list[str]]) -> None:
    result = run_braid("prune", "--repo", str(repo), "--json")
    assert result.code == 0, result.stderr
    report = json.loads(result.out)
    assert report["forget"] == [] and report["unmanaged"] == ["logs", "pg"]
    assert len(listed(repo)) == 23


def test_a_corrupt_stored_policy_stops_the_prune(repo: Path, calendar: dict[str, list[str]]) -> None:
    (repo / "policies").mkdir()
    (repo / "policies" / "pg.json").write_text('{"version": 1, "name": "pg", "rules": {"keep_daily": -1}}')
    result = run_braid("prune", "--repo", str(repo))
    assert result.code == 6 and "stored retention policy" in result.stderr and "policies/pg.json is not valid" in result.stderr
    assert len(listed(repo)) == 23


def test_saved_rounds_towards_zero() -> None:
    from braid.cli.render import saved

    assert saved(977 * 1024, 977 * 1024 + 90) == "0%"  # incompressible: a few bytes of framing are not "-1%"
    assert saved(10_000, 19_900) == "-99%"
    assert saved(10_000, 20) == "99%"
    assert saved(10_000, 3_100) == "69%"
    assert saved(0, 0) == "-" and saved(1000, 310) == "-"  # tiny: the frame's overhead, not compression, would decide
