#!/bin/bash
# What a NATS sink costs per event, in CPU of each process, without the workload around it
# (session 31, BENCHMARKS.md "Events"). A coordinator started on a copy of a database whose
# event log is full delivers the whole log to a stream of its own; the CPU time of the
# coordinator, of every PostgreSQL process and of nats-server over the drain, per event.
#
# The source database, once (an all-in-one on PostgreSQL, a workload's events):
#   psql postgres://postgres@127.0.0.1:5432/postgres -c "CREATE DATABASE drainsrc"
#   holdfast --database-url postgres://postgres@127.0.0.1:5432/drainsrc --ephemeral-token-secret &
#   holdfast bench throughput --target http://127.0.0.1:50051 --duration 25s
#   kill %1; psql postgres://postgres@127.0.0.1:5432/drainsrc -c ANALYZE
# Then, per build: bash 2026-12-07-s31-sink-drain.sh path/to/holdfast TAG
# (needs a local nats-server with JetStream on 4222; database "drain" is made from drainsrc and
# dropped afterwards). The polling psql sessions are short-lived backends, not counted.
set -e
BIN=$1; TAG=$2
PG=postgres://postgres@127.0.0.1:5432
psql -q $PG/postgres -c "DROP DATABASE IF EXISTS drain" -c "CREATE DATABASE drain TEMPLATE drainsrc" >/dev/null
psql -q $PG/drain -c "DELETE FROM event_sinks" -c "ANALYZE" >/dev/null
N=$(psql -tA $PG/drain -c "SELECT count(*) FROM events")
LAST=$(psql -tA $PG/drain -c "SELECT max(sequence) FROM events")
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
pgcpu() { local s=0; for p in $(pgrep -u postgres postgres); do s=$((s + $(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null || echo 0))); done; echo $s; }
NATS=$(pgrep nats-server)
STREAM=DRAIN_${TAG}_$RANDOM
PORT=$((40000 + RANDOM % 10000))
$BIN coordinator --database-url $PG/drain --listen 127.0.0.1:$PORT --metrics-listen 127.0.0.1:$((PORT+1)) \
  --insecure-no-auth --ephemeral-token-secret --events-nats-url nats://127.0.0.1:4222 \
  --events-nats-stream $STREAM --events-nats-subject d$STREAM --events-nats-create-stream >/tmp/drain-$TAG.log 2>&1 &
CP=$!
# wait for the sink row (the drain has started)
for i in $(seq 1 200); do
  r=$(psql -tA $PG/drain -c "SELECT count(*) FROM event_sinks" 2>/dev/null || echo 0)
  [ "$r" = "1" ] && break; sleep 0.05
done
c0=$(cpu $CP); p0=$(pgcpu); n0=$(cpu $NATS); t0=$(date +%s.%N)

d0=$(psql -tA $PG/drain -c "SELECT delivered_through FROM event_sinks")
while true; do
  d=$(psql -tA $PG/drain -c "SELECT delivered_through FROM event_sinks")
  [ "$d" = "$LAST" ] && break
  sleep 0.1
done
c1=$(cpu $CP); p1=$(pgcpu); n1=$(cpu $NATS); t1=$(date +%s.%N)

DONE=$(psql -tA $PG/drain -c "SELECT count(*) FROM events WHERE sequence > $d0")
kill $CP; wait $CP 2>/dev/null || true
HZ=$(getconf CLK_TCK)
python3 - <<PY
hz=$HZ; n=$DONE
print(f"$TAG events={n} secs={$t1-$t0:.2f} rate={n/($t1-$t0):.0f}/s us/event holdfast={($c1-$c0)*1e6/hz/n:.1f} pg={($p1-$p0)*1e6/hz/n:.1f} nats={($n1-$n0)*1e6/hz/n:.1f}")
PY
# delete the stream
nats_del() { python3 - "$1" <<'PY'
import socket,sys
s=socket.create_connection(("127.0.0.1",4222)); s.recv(4096)
s.sendall(b'CONNECT {"verbose":false}\r\nSUB _INBOX.x 1\r\nPUB $JS.API.STREAM.DELETE.'+sys.argv[1].encode()+b' _INBOX.x 0\r\n\r\nPING\r\n')
import time; time.sleep(0.3); s.close()
PY
}
nats_del $STREAM
psql -q $PG/postgres -c "DROP DATABASE drain" >/dev/null
