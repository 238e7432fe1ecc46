//! The storage conformance suite: every case in `cases/` (one file per topic) is written once
//! against `Arc<dyn Store>` and run against both backends - PostgreSQL (a fresh database per
//! test, `#[sqlx::test]`, from `DATABASE_URL`) and SQLite (a fresh file per test). Test names
//! read `<topic>::<case>::postgres` and `<topic>::<case>::sqlite`.
//!
//! `grpc.rs` also serves the real coordinator over gRPC on a SQLite store (a smoke test).

mod ack_relay;
mod branch_order;
mod cases;
mod checks;
#[path = "../shared/folded_checks.rs"]
mod folded_checks;
#[path = "../shared/generic_plans.rs"]
mod generic_plans;
mod grpc;
mod migration;
#[path = "../shared/parallel.rs"]
#[allow(unused_macros, unused_imports)]
// parallel_test!: the conformance macro uses on_multi_thread
mod parallel;
mod plans;
mod plans_events;
mod plans_find;
mod pool;

use std::path::PathBuf;
use std::sync::Arc;

use holdfast::store::{PgStore, SqliteStore, Store};
use sqlx::PgPool;

/// The coordinator's schema on a fresh PostgreSQL database.
pub async fn postgres(pool: PgPool) -> Arc<dyn Store> {
    let store = PgStore::from_pool(pool);
    store.migrate().await.unwrap();
    Arc::new(store)
}

/// A fresh SQLite file, deleted (with its WAL files) when dropped.
pub struct TempDb {
    pub path: PathBuf,
    pub url: String,
}

impl TempDb {
    pub fn fresh() -> TempDb {
        let path = std::env::temp_dir().join(format!("holdfast-store-{}.db", uuid::Uuid::new_v4()));
        let url = format!("sqlite://{}", path.display());
        TempDb { path, url }
    }

    /// The coordinator's schema on this file.
    pub async fn store(&self) -> SqliteStore {
        let store = SqliteStore::connect(&self.url, 8).await.unwrap();
        store.migrate().await.unwrap();
        store
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Runs each `cases::<topic>::<case>` against both backends, as the tests
/// `<topic>::<case>::postgres` and `<topic>::<case>::sqlite`.
macro_rules! conformance {
    ($($topic:ident: [$($case:ident),* $(,)?]),* $(,)?) => {
        $(
            mod $topic {
                $(
                    mod $case {
                        // Multi-threaded, like the SQLite run: concurrent cases really race.
                        #[sqlx::test(migrations = false)]
                        async fn postgres(
                            pool: sqlx::postgres::PgPoolOptions,
                            connect: sqlx::postgres::PgConnectOptions,
                        ) {
                            crate::parallel::on_multi_thread(pool, connect, |pool| async move {
                                crate::cases::$topic::$case(crate::postgres(pool).await).await;
                            })
                            .await;
                        }

                        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                        async fn sqlite() {
                            let db = crate::TempDb::fresh();
                            let store = std::sync::Arc::new(db.store().await);
                            crate::cases::$topic::$case(store).await;
                        }
                    }
                )*
            }
        )*
    };
}

conformance!(
    waitlist: [
        joins_in_order_and_a_full_queue_writes_nothing,
        something_placed_is_released_before_it_waits,
        an_offer_starts_once_and_a_refused_one_keeps_its_place,
        cancel_of_a_queued_reservation_leaves_the_queue,
        waits_end_with_queue_wait_ended,
        one_instance_offers_a_queue_at_a_time,
        hold_limits_count_queued_reservations,
    ],
    list_filters: [participant_time_and_labels],
    admin: [
        force_cancel_held_and_trying,
        resolve_only_failed,
        resolve_cancelled_keeps_one_refund,
        retry_wakes_and_leases_unfinished_work,
        list_stuck_filters,
    ],
    create: [
        create_records_trying,
        create_is_idempotent,
        the_same_call_again_answers_its_own_row,
        request_recorded_reads_the_idempotency_key,
        hold_limit_per_holder_and_total,
        concurrent_creates_respect_the_limit,
    ],
    decide: [
        decide_confirm,
        decide_cancel,
        decide_extend,
        decide_token_mismatch_not_found_not_held,
        lazy_expiry,
        decide_on_lapsed_hold_expires_it,
        extend_repeat_is_not_applied_twice,
        decide_sees_changes_since_placement,
    ],
    phases: [
        record_held_only_from_trying,
        record_rejected_then_finish,
        record_rejected_with_nothing_placed_is_final,
        discard_only_what_holds_nothing,
        record_phase_backoff_and_wrong_state,
    ],
    recovery: [
        claim_due_leases_lapsed_holds_as_they_are,
        a_decision_before_the_sweeps_expiry_wins,
        claim_due_takes_abandoned_trying,
        concurrent_claimers_never_share,
        backlog_and_wake,
        renew_lease_only_by_owner,
        waiting_on_names_each_participant_s_work,
        make_due_only_trying_or_held,
    ],
    payments: [
        refund_recorded_once,
        refund_attempts,
        refused_refund_is_parked,
        late_payment_refund_policy,
        late_payment_honoured_in_place,
        retake_confirms,
        retake_fails_and_refunds,
        failed_refunds_payment,
    ],
    bindings: [
        unverified_payment_changes_nothing,
        payment_ref_belongs_to_one_reservation,
        racing_confirms_bind_a_payment_once,
        further_payment_is_refunded,
        refused_further_refund_is_parked,
    ],
    list: [list_pages_and_filters, every_shape_answers_as_a_full_read_filtered],
    find: [
        id_prefix_finds_its_range_in_id_order,
        request_id_finds_every_holders_newest_first,
        counts_by_state_come_from_the_database,
        work_of_reads_when_each_is_driven_next,
    ],
    events: [
        lifecycle_appends_events_in_order,
        events_carry_their_generation_s_branches,
        readers_see_only_their_owner_s_events,
        sinks_keep_a_cursor_a_lease_and_a_pause,
        retention_never_passes_an_active_sink,
    ],
    writes: [
        writes_answer_with_the_stored_reservation,
        concurrent_writes_are_each_recorded,
        concurrent_rejections_are_each_recorded,
        callers_that_leave_fail_no_other_write,
    ],
);

/// PostgreSQL only: readers never pass a transaction held open, and replicas writing at once
/// lose nothing (SQLite's one writer numbers events at insert, in commit order).
mod events_postgres {
    #[sqlx::test(migrations = false)]
    async fn a_transaction_held_open_is_read_once_when_it_commits(
        pool: sqlx::postgres::PgPoolOptions,
        connect: sqlx::postgres::PgConnectOptions,
    ) {
        crate::parallel::on_multi_thread(pool, connect, |pool| async move {
            crate::cases::events::a_transaction_held_open_is_read_once_when_it_commits(pool).await;
        })
        .await;
    }

    #[sqlx::test(migrations = false)]
    async fn another_database_s_open_transaction_holds_no_reader_back(
        pool: sqlx::postgres::PgPoolOptions,
        connect: sqlx::postgres::PgConnectOptions,
    ) {
        crate::parallel::on_multi_thread(pool, connect, |pool| async move {
            crate::cases::events::another_database_s_open_transaction_holds_no_reader_back(pool)
                .await;
        })
        .await;
    }

    #[sqlx::test(migrations = false)]
    async fn two_replicas_writing_lose_nothing(
        pool: sqlx::postgres::PgPoolOptions,
        connect: sqlx::postgres::PgConnectOptions,
    ) {
        crate::parallel::on_multi_thread(pool, connect, |pool| async move {
            crate::cases::events::two_replicas_writing_lose_nothing(pool).await;
        })
        .await;
    }
}

/// PostgreSQL only: its group commit after a lost commit acknowledgement or a failed batch,
/// and concurrent Confirms sharing a statement (SQLite's group commit is its writer's).
mod lost_ack {
    #[sqlx::test(migrations = false)]
    async fn record_phase_counts_a_batch_once(pool: sqlx::PgPool) {
        crate::cases::lost_ack::record_phase_counts_a_batch_once(pool).await;
    }

    #[sqlx::test(migrations = false)]
    async fn create_after_a_lost_ack_answers_the_new_reservation(pool: sqlx::PgPool) {
        crate::cases::lost_ack::create_after_a_lost_ack_answers_the_new_reservation(pool).await;
    }

    #[sqlx::test(migrations = false)]
    async fn record_rejected_after_a_lost_ack_is_applied_once(pool: sqlx::PgPool) {
        crate::cases::lost_ack::record_rejected_after_a_lost_ack_is_applied_once(pool).await;
    }

    #[sqlx::test(migrations = false)]
    async fn a_failed_batch_reruns_its_calls_at_once(pool: sqlx::PgPool) {
        crate::cases::failed_batch::a_failed_batch_reruns_its_calls_at_once(pool).await;
    }

    #[sqlx::test(migrations = false)]
    async fn concurrent_confirms_share_one_statement(pool: sqlx::PgPool) {
        crate::cases::shared_confirms::concurrent_confirms_share_one_statement(pool).await;
    }

    #[sqlx::test(migrations = false)]
    async fn confirms_after_a_lost_ack_are_applied_once(pool: sqlx::PgPool) {
        crate::cases::shared_confirms::confirms_after_a_lost_ack_are_applied_once(pool).await;
    }
}

/// Retention cases run on both backends like the conformance cases, with a [`Backdate`] of
/// each backend's SQL (`updated_at` and any lease a day back) to make a reservation old.
///
/// [`Backdate`]: cases::retention::Backdate
macro_rules! retention {
    ($($case:ident),* $(,)?) => {
        mod retention {
            $(
                mod $case {
                    use std::sync::Arc;

                    #[sqlx::test(migrations = false)]
                    async fn postgres(
                        pool: sqlx::postgres::PgPoolOptions,
                        connect: sqlx::postgres::PgConnectOptions,
                    ) {
                        crate::parallel::on_multi_thread(pool, connect, |pool| async move {
                            let store = crate::postgres(pool.clone()).await;
                            let backdate: crate::cases::retention::Backdate = Arc::new(move |id| {
                                let pool = pool.clone();
                                Box::pin(async move {
                                    sqlx::query("UPDATE reservations SET updated_at = updated_at - interval '1 day', lease_until = lease_until - interval '1 day' WHERE id = $1")
                                        .bind(id)
                                        .execute(&pool)
                                        .await
                                        .unwrap();
                                })
                            });
                            crate::cases::retention::$case(store, backdate).await;
                        })
                        .await;
                    }

                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn sqlite() {
                        let db = crate::TempDb::fresh();
                        let store = Arc::new(db.store().await);
                        let pool = holdfast::db::open_sqlite(&db.url, 2).await.unwrap();
                        let backdate: crate::cases::retention::Backdate = Arc::new(move |id| {
                            let pool = pool.clone();
                            Box::pin(async move {
                                sqlx::query("UPDATE reservations SET updated_at = updated_at - 86400000000, lease_until = lease_until - 86400000000 WHERE id = ?1")
                                    .bind(id)
                                    .execute(&pool)
                                    .await
                                    .unwrap();
                            })
                        });
                        crate::cases::retention::$case(store, backdate).await;
                    }
                }
            )*
        }
    };
}

retention!(
    purges_only_finished_old_work,
    batch_bound_is_respected,
    reserve_after_deletion_is_new,
    audit_entries_go_with_their_reservation,
);
