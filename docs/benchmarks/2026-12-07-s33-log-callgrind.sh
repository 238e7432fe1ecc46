#!/bin/bash
# Instructions per Reserve+Confirm lifecycle of the s29/s30 harness's writes of `reservations`
# (INSERT TRYING, UPDATE HELD, UPDATE CONFIRMING with a payment, UPDATE CONFIRMED; BATCH
# reservations per statement), by variant of the event log's trigger (session 33,
# 2026-12-07-s33-log-variants.sql says what each is). Counted by callgrind on a private
# PostgreSQL 15 whose postmaster runs under valgrind (every backend it forks is counted): the
# same count every run, where CPU time on a shared 2-core VM moved by a third. A variant's
# figure is (Ir of a backend running N2 lifecycles - Ir of one running N1) / (N2 - N1), so a
# session's fixed costs cancel.
#
# usage (as root, with the Debian postgresql-15 and valgrind packages):
#   bash 2026-12-07-s33-log-callgrind.sh BATCH N1 N2 VARIANT...
#   e.g. bash 2026-12-07-s33-log-callgrind.sh 4 40 200 A0 A A1 AN
# The instance (port 5499, socket in /tmp, data in /tmp/hf-callgrind) is made on the first
# run and left running; stop it with `pkill -f hf-callgrind`.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DIR=/tmp/hf-callgrind
PORT=5499
BIN=/usr/lib/postgresql/15/bin
B=$1; N1=$2; N2=$3; shift 3
P="psql -qAt -h /tmp -p $PORT -U postgres"
if ! $P -d postgres -c "SELECT 1" >/dev/null 2>&1; then
  rm -rf $DIR && mkdir -p $DIR/data $DIR/out && chown -R postgres $DIR
  su postgres -c "$BIN/initdb -D $DIR/data -A trust" >/dev/null
  su postgres -c "cd /tmp; nohup valgrind --tool=callgrind --callgrind-out-file=$DIR/out/cg.%p \
    $BIN/postgres -D $DIR/data -p $PORT -k /tmp -c listen_addresses= -c autovacuum=off \
    -c synchronous_commit=off -c fsync=off > $DIR/postmaster.log 2>&1 &"
  for _ in $(seq 1 120); do $P -d postgres -c "SELECT 1" >/dev/null 2>&1 && break; sleep 1; done
  $P -d postgres -c "CREATE DATABASE harness"
  for f in "$ROOT"/crates/holdfast-coordinator/migrations/coordinator/*.sql; do
    $P -d harness -v ON_ERROR_STOP=1 -1 -f "$f" >/dev/null
  done
  for f in 2026-12-06-s29-outbox-harness.sql 2026-12-06-s30-writes-harness.sql \
           2026-12-07-s33-log-variants.sql; do
    $P -d harness -f "$HERE/$f" >/dev/null 2>&1
  done
fi
export PGOPTIONS="-c synchronous_commit=off -c plan_cache_mode=force_generic_plan -c random_page_cost=1.1"
# The Ir of one backend that runs `n` lifecycles of variant `v` (after 400 on emptied tables).
ir() {
  local v=$1 n=$2 proc=life_a
  [ "$v" = A1 ] && proc=life_a1
  $P -d harness -c "CALL use_log('$v')" >/dev/null 2>&1
  $P -d harness -c "TRUNCATE reservations, events, events_np, events_nr CASCADE" \
    -c "CALL $proc(400, $B)" -c "VACUUM ANALYZE reservations, events, events_np, events_nr" >/dev/null 2>&1
  local pid
  pid=$($P -d harness -c "SELECT pg_backend_pid()" -c "CALL $proc($n, $B)" | head -1)
  for _ in $(seq 1 100); do grep -qs "^summary:" $DIR/out/cg.$pid && break; sleep 0.3; done
  grep -m1 "^summary:" $DIR/out/cg.$pid | awk '{print $2}'
}
for v in "$@"; do
  a=$(ir "$v" "$N1"); b=$(ir "$v" "$N2")
  echo "batch=$B $v instructions_per_lifecycle=$(( (b - a) / (N2 - N1) ))"
done
$P -d harness -c "CALL use_log('A')" >/dev/null 2>&1
