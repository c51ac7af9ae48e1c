#!/usr/bin/env bash
# scripts/bench pg, archive-rate row: archive_command latency (p50, p99) and the pg_stat_archiver backlog
# under pgbench -c 8 -j 2, for `cp` to a local directory, pgBackRest's archive-push (archive-async, zstd 3,
# aes-256-cbc, process-max 2), `braid wal-push --async` and `braid wal-push`, one cluster, one run.
# Each archive_command runs inside a wrapper that logs its start and end. Prints the WAL rate pgbench
# makes here ("pgbench MB/s"), then per side, from a backlog of SEGMENTS (24) segments written with
# archiving paused: "side  calls  drain_MB_s  p50_s  p99_s  drain_s". Before those, the same pgbench with
# archive_command = braid wal-push --async, the .ready files counted every 0.2 s:
# "backlog  braid-async  wal_MB_s  COUNT COUNT ...".
#   pg_archive.sh BRAID PGBIN WORKDIR SECONDS   (as root: PostgreSQL runs as postgres)
set -euo pipefail
braid=$1 pgbin=$2 W=$3 seconds=$4
bindir=$(dirname "$braid")
mkdir -p "$W" && chown postgres: "$W" && chmod 0755 "$W"
as_pg() { runuser -u postgres -- env -i HOME="$W" PATH="$bindir:$pgbin:/usr/bin:/bin" LANG=C.UTF-8 PGHOST="$W" PGPORT=54349 PGUSER=postgres "$@"; }
psql_() { as_pg psql -Atc "$1" postgres; }
sampler=
pushers() { for lock in "$W"/$1/*/pusher.lock; do [ -s "$lock" ] && kill "$(cat "$lock")" 2>/dev/null || true; done; }
stop() { [ -f "$W/data/postmaster.pid" ] && as_pg pg_ctl -D "$W/data" -m immediate stop >/dev/null 2>&1 || true
         [ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true
         pushers 'spool*'; }
trap stop EXIT
as_pg mkdir -p "$W/data" "$W/cp" "$W/pgbr/repo" "$W/pgbr/spool" "$W/pgbr/log" "$W/pgbr/lock"
as_pg install -d -m 0700 "$W/spool" "$W/spool-backlog"
chmod 0700 "$W/data"
as_pg initdb -D "$W/data" -U postgres --auth=trust >/dev/null
cat > "$W/timed.sh" <<'EOF'
#!/bin/bash
# archive_command wrapper: LOG SIDE COMMAND... ; logs "side start end rc" (seconds) for every call
log=$1 side=$2; shift 2
s=$EPOCHREALTIME; "$@"; rc=$?; e=$EPOCHREALTIME
echo "$side $s $e $rc" >> "$log"
exit $rc
EOF
chmod 0755 "$W/timed.sh"
cat > "$W/pgbackrest.conf" <<CONF
[global]
repo1-path=$W/pgbr/repo
repo1-cipher-type=aes-256-cbc
repo1-cipher-pass=$(openssl rand -hex 32)
compress-type=zst
compress-level=3
archive-async=y
spool-path=$W/pgbr/spool
process-max=2
log-path=$W/pgbr/log
lock-path=$W/pgbr/lock
log-level-console=warn
log-level-file=off

[bench]
pg1-path=$W/data
pg1-socket-path=$W
pg1-port=54349
CONF
chown postgres: "$W/pgbackrest.conf" && chmod 0600 "$W/pgbackrest.conf"
cat >> "$W/data/postgresql.conf" <<CONF
port = 54349
listen_addresses = ''
unix_socket_directories = '$W'
archive_mode = on
archive_command = '$W/timed.sh $W/latency.log warmup cp %p $W/cp/%f'
max_wal_size = 4GB
synchronous_commit = off   # pgbench writes as much WAL as it can: the archive is what is measured
CONF
as_pg pg_ctl -D "$W/data" -l "$W/server.log" -w start >/dev/null
as_pg pgbackrest --config="$W/pgbackrest.conf" --stanza=bench stanza-create >/dev/null
as_pg braid init --repo "$W/repo" --key-file "$W/master.key" >/dev/null 2>&1
as_pg pgbench -i -q -s 10 postgres >/dev/null 2>&1

declare -A commands=(
  [cp]="cp %p $W/cp/%f"
  [pgbackrest-async]="pgbackrest --config=$W/pgbackrest.conf --stanza=bench archive-push %p"
  [braid-async]="braid wal-push --repo $W/repo --key-file $W/master.key --name pg --async --spool $W/spool %p"
  [braid]="braid wal-push --repo $W/repo --key-file $W/master.key --name pg %p"
)
wait_archived() {
  for _ in $(seq 1 1200); do
    [ "$(psql_ "SELECT coalesce(last_archived_wal >= '$1', false) FROM pg_stat_archiver")" = t ] && return 0
    sleep 0.1
  done
  echo "pg_archive.sh: $1 not archived within 120 s" >&2; return 1
}
# The WAL rate pgbench -c 8 -j 2 produces here (archived by cp meanwhile).
lsn0=$(psql_ "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
as_pg pgbench -n -c 8 -j 2 -T "$seconds" postgres >/dev/null 2>&1
lsn1=$(psql_ "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
printf 'pgbench\t%.2f\n' "$(awk -v b=$((lsn1 - lsn0)) -v s="$seconds" 'BEGIN { print b / s / 1e6 }')"
# The backlog under the same load with archive_command = braid wal-push --async: the .ready files in
# archive_status counted every 0.2 s while pgbench runs and until the last segment is archived.
# Its own spool, so that the drain rows below start their pusher cold as before.
psql_ "ALTER SYSTEM SET archive_command = '$W/timed.sh $W/latency.log backlog ${commands[braid-async]/$W\/spool /$W/spool-backlog }'" >/dev/null
psql_ "SELECT pg_reload_conf()" >/dev/null
( while :; do n=$(ls "$W/data/pg_wal/archive_status" | grep -c '\.ready$' || true); echo "$n"; sleep 0.2; done ) > "$W/backlog.txt" &
sampler=$!
lsn0=$(psql_ "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
as_pg pgbench -n -c 8 -j 2 -T "$seconds" postgres >/dev/null 2>&1
lsn1=$(psql_ "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
seg=$(psql_ "SELECT pg_walfile_name(pg_current_wal_lsn())")
psql_ "SELECT pg_switch_wal()" >/dev/null
wait_archived "$seg"
kill "$sampler" && wait "$sampler" 2>/dev/null || true
sampler=
pushers spool-backlog
printf 'backlog\tbraid-async\t%.2f\t%s\n' "$(awk -v b=$((lsn1 - lsn0)) -v s="$seconds" 'BEGIN { print b / s / 1e6 }')" "$(tr '\n' ' ' < "$W/backlog.txt")"
psql_ "CREATE TABLE filler (id int, pad text)" >/dev/null
# Per side: archiving paused (an empty archive_command keeps the WAL), SEGMENTS segments written at once,
# then the side's command: how fast it drains the backlog, and each call's latency.
for side in cp pgbackrest-async braid-async braid; do
  psql_ "ALTER SYSTEM SET archive_command = ''" >/dev/null
  psql_ "SELECT pg_reload_conf()" >/dev/null
  sleep 0.5
  psql_ "INSERT INTO filler SELECT g, md5(g::text) || repeat('x', 180) FROM generate_series(1, ${SEGMENTS:-24} * 60000) g" >/dev/null
  seg=$(psql_ "SELECT pg_walfile_name(pg_current_wal_lsn())")
  psql_ "SELECT pg_switch_wal()" >/dev/null
  backlog=$(ls "$W/data/pg_wal/archive_status" | grep -c '\.ready$' || true)
  t0=$EPOCHREALTIME
  psql_ "ALTER SYSTEM SET archive_command = '$W/timed.sh $W/latency.log $side ${commands[$side]}'" >/dev/null
  psql_ "SELECT pg_reload_conf()" >/dev/null
  wait_archived "$seg"
  t1=$EPOCHREALTIME
  awk -v side="$side" -v backlog="$backlog" -v t0="$t0" -v t1="$t1" '
    $1 == side && $4 == 0 { n++; d[n] = $3 - $2 }
    END {
      asort(d); i99 = int(n * 0.99 + 0.999); if (i99 < 1) i99 = 1
      printf "%s\t%d\t%.1f\t%.3f\t%.3f\t%.2f\n", side, n, n * 16.777216 / (t1 - t0), (n ? d[int((n + 1) / 2)] : 0), (n ? d[i99] : 0), t1 - t0
    }' "$W/latency.log"
  psql_ "TRUNCATE filler" >/dev/null
done
