#!/usr/bin/env bash
# Replica scaling (SPEC 12, issue 45): `holdfast bench throughput` against 1, 2 and 4
# coordinator processes sharing one PostgreSQL database, in one run, each row with the same
# participants (noop, seats, stock: one process each, on databases of their own on the same
# server) and the same clients, spread round robin over the replicas (`--target` with the
# replicas' URLs separated by commas). Prints each row's bench table and the commits the
# server counted in the row's databases meanwhile (pg_stat_database.xact_commit: divided by the
# row's completed operations, what one costs in commits); with JSON=DIR also writes
# DIR/replicas-N.json.
#
#   cargo build --release && BIN=$PWD/target/release/holdfast docs/benchmarks/replicas.sh
#   (PG=postgres://postgres@127.0.0.1:5432 CLIENTS=64 DURATION=10s REPLICAS="1 2 4")
#
# Drops and recreates the databases holdfast_bench_replicas*, nothing else.
set -euo pipefail
BIN=${BIN:-./target/release/holdfast}
PG=${PG:-postgres://postgres@127.0.0.1:5432}
DB=holdfast_bench_replicas
CLIENTS=${CLIENTS:-64}
DURATION=${DURATION:-10s}
REPLICAS=${REPLICAS:-1 2 4}
export RUST_LOG=${RUST_LOG:-error}

work=$(mktemp -d)
pids=()               # the row's coordinators
participant_pids=()   # the participants, for the whole run
stop() {
  for pid in "$@"; do kill -INT "$pid" 2>/dev/null || true; done
  for pid in "$@"; do wait "$pid" 2>/dev/null || true; done
}
trap 'stop "${pids[@]}" "${participant_pids[@]}"; rm -rf "$work"' EXIT

# Waits until something listens on 127.0.0.1:$1.
listening() {
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on $1" >&2
  return 1
}

# Commits counted so far in this run's databases (the statistics are flushed within a second).
commits() {
  sleep 1.5
  psql "$PG/postgres" -Atc \
    "SELECT sum(xact_commit) FROM pg_stat_database WHERE datname LIKE '${DB}%'"
}

for db in "$DB" "${DB}_noop" "${DB}_seats" "${DB}_stock"; do
  psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
done
"$BIN" keys token-secret > "$work/token-secret.toml"
"$BIN" migrate --database-url "$PG/$DB"

for p in noop:50265 seats:50261 stock:50262; do
  kind=${p%%:*} port=${p##*:}
  "$BIN" participant "$kind" --listen "127.0.0.1:$port" --database-url "$PG/${DB}_$kind" \
    --metrics-listen off > "$work/$kind.log" 2>&1 &
  participant_pids+=($!)
  listening "$port"
done

for n in $REPLICAS; do
  targets=()
  for i in $(seq 1 "$n"); do
    port=$((50250 + i))
    "$BIN" coordinator --listen "127.0.0.1:$port" --database-url "$PG/$DB" \
      --participant noop=http://127.0.0.1:50265 --participant seats=http://127.0.0.1:50261 \
      --participant stock=http://127.0.0.1:50262 --token-secret-file "$work/token-secret.toml" \
      --http-listen off --metrics-listen off > "$work/coordinator-$n-$i.log" 2>&1 &
    pids+=($!)
    listening "$port"
    targets+=("http://127.0.0.1:$port")
  done
  echo "== $n coordinator replica(s)"
  json=()
  [ -n "${JSON:-}" ] && json=(--json "$JSON/replicas-$n.json")
  before=$(commits)
  "$BIN" bench throughput --target "$(IFS=,; echo "${targets[*]}")" --noop noop \
    --seats-admin http://127.0.0.1:50261 --stock-admin http://127.0.0.1:50262 \
    --clients "$CLIENTS" --duration "$DURATION" "${json[@]}" \
    || echo "== $n replica(s): the bench reported failures (above); going on"
  stop "${pids[@]}"
  pids=()
  echo "commits in the row's databases: $(( $(commits) - before ))"
done
