# usage: DB=scratch bash 2026-12-06-s29-outbox-run.sh BATCH N ROUNDS: the backend CPU per lifecycle of
# A, A0 and B (2026-12-06-s29-outbox-harness.sql, loaded into DB, a database with the coordinator's
# migrations; a superuser reads /proc/self/stat)
P="psql -U postgres -h 127.0.0.1 -qAt -d ${DB:-spike}"
B=$1; N=$2
trig() { for t in reservations_recorded_events reservations_changed_events; do $P -c "ALTER TABLE reservations $1 TRIGGER $t"; done; }
for round in $(seq 1 $3); do for v in A A0 B; do
  case $v in A) trig ENABLE;; A0) trig DISABLE;; B) trig ENABLE;; esac
  $P -c "VACUUM reservations, b_live, b_reservation, events, b_events" 2>/dev/null
  proc=life_a; [ $v = B ] && proc=life_b
  t=$(PGOPTIONS='-c synchronous_commit=off' $P -c "SELECT mycpu()" -c "CALL $proc($N, $B)" -c "SELECT mycpu()" | tr '\n' ' ')
  set -- $t; echo "batch=$B round=$round $v ticks=$(( $2 - $1 )) us_per_life=$(( ($2 - $1) * 10000 / N ))"
done; done
