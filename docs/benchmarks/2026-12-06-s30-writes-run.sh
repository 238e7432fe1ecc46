# usage: DB=scratch bash 2026-12-06-s30-writes-run.sh BATCH N ROUNDS VARIANT...: us of one
# backend's CPU per Reserve+Confirm lifecycle (4 statements of BATCH reservations each), with the
# generic plans the coordinator's pooled statements get, its `random_page_cost`, and
# `synchronous_commit=off`; the variants interleaved in each round, each on emptied tables after
# 2,000 lifecycles and an ANALYZE. Variants: i18, i12, i9, i7 (+ `a`, `n`: CHECKs as array
# constants, none; build each first with CALL s30_table('<variant>')), and A, A0, A1, B, B0, BT,
# ca and D0 (2026-12-06-s30-writes-harness.sql says what each is).
P="psql -U postgres -h 127.0.0.1 -qAt -d ${DB:-spike}"
export PGOPTIONS="-c synchronous_commit=off -c plan_cache_mode=force_generic_plan -c random_page_cost=1.1"
B=$1; N=$2; R=$3; shift 3; V=("$@")
log() { for t in reservations_recorded_events reservations_changed_events; do
          $P -c "ALTER TABLE reservations $1 TRIGGER $t"; done
        for t in b_recorded b_changed; do $P -c "ALTER TABLE b_live $2 TRIGGER $t"; done; }
for round in $(seq 1 "$R"); do for v in "${V[@]}"; do
  case $v in
    i*) tables="x_$v"; proc="life_$v";;
    ca) tables="x_ca, x_ca_listed"; proc=life_ca;;
    D0) tables="d_live, b_reservation"; proc=life_d0;;
    A|A0|A1) tables="reservations, events"; proc=life_a; [ "$v" = A1 ] && proc=life_a1;;
    B|B0|BT) tables="b_live, b_reservation, b_events"; proc=life_b; [ "$v" != B ] && proc=life_b0;;
  esac
  case $v in A) log ENABLE DISABLE;; BT) log DISABLE ENABLE;; *) log DISABLE DISABLE;; esac
  $P -c "TRUNCATE $tables CASCADE" -c "CALL $proc(2000, $B)" -c "VACUUM ANALYZE $tables" 2>/dev/null
  read -r a b <<< "$($P -c "SELECT mycpu()" -c "CALL $proc($N, $B)" -c "SELECT mycpu()" | tr '\n' ' ')"
  echo "batch=$B round=$round $v us_per_life=$(( (b - a) * 10000 / N ))"
done; done
log ENABLE DISABLE
