//! The statements the store's shared logic is written over: [`ReservationSql`], one
//! implementation per database (`postgres/decide.rs`, `sqlite/decide.rs`).
//!
//! Each function is one primitive statement (or, where a dialect needs it, a few) on the
//! caller's connection, usually inside the transaction [`ReservationSql::begin_write`] opened.
//! The decisions built from them (which statement, in which order, what its row count means)
//! live once, in `decide.rs`, `retake.rs`, `outcome.rs` and `admission.rs`; an implementation
//! only says how its database spells each statement.

use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use super::{BranchReport, RefundAnswer, StoreError, WorkLease};
use crate::domain::policy::Backoff;
use crate::domain::validate::RequestId;
use crate::domain::{ExtraPayment, Payment, Reservation, State};

/// What a decision's conditional UPDATE did.
#[derive(Debug)]
pub(crate) enum Applied {
    /// The row was not as the UPDATE required: nothing changed.
    Missed,
    /// Written. `leased`: the same statement leased the reservation to the decider (both
    /// databases' `leave_held` do, saving a statement); otherwise the decision flow takes the
    /// lease afterwards. `read_back`: the reservation as the statement left it, when the
    /// statement answered with it (SQLite's `leave_held`, by `RETURNING`: one hand-off fewer on
    /// its writer); otherwise the flow reads it.
    Written {
        leased: bool,
        read_back: Option<Box<Reservation>>,
    },
}

impl Applied {
    /// A conditional UPDATE's answer (whether its row was as required), no lease taken by it.
    pub(crate) fn unleased(written: bool) -> Applied {
        if written {
            Applied::Written {
                leased: false,
                read_back: None,
            }
        } else {
            Applied::Missed
        }
    }
}

/// A database the coordinator keeps its reservations in: PostgreSQL ([`sqlx::Postgres`]) or
/// SQLite ([`sqlx::Sqlite`]). Every "now" is the database clock's, read inside the statement
/// that decides. Conditional writes answer whether they applied (their row count).
/// What keeps a row as it was judged until its write lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Guard {
    /// The row is locked by the transaction the write runs in.
    RowLock,
    /// The row was read without a lock: the write lands only on this version, the one judged.
    Version(i64),
}

impl Guard {
    /// The version the write must find, if it is guarded by one.
    pub(crate) fn version(self) -> Option<i64> {
        match self {
            Guard::RowLock => None,
            Guard::Version(v) => Some(v),
        }
    }
}

/// A decided move out of `HELD` (a Confirm's or a Cancel's [`Verdict::Transition`]): the
/// write description a database's executor runs as one UPDATE. The row must be `HELD`, as
/// `guard` keeps it, and unexpired by the database clock at the UPDATE; it moves to `to`, takes the
/// decider's `lease` (a database whose UPDATE cannot take it leaves it to the flow) and the
/// Confirm's `payment` unless one is recorded (and unless another reservation recorded that
/// payment as a further one); a Cancel's `release_outcome` and `cancel_reason` are set.
/// Anything else makes it miss, and nothing changes.
#[derive(Clone, Debug)]
pub(crate) struct LeaveHeld {
    pub id: Uuid,
    pub guard: Guard,
    pub to: State,
    pub release_outcome: Option<State>,
    pub cancel_reason: Option<String>,
    pub payment: Option<Payment>,
    pub lease: WorkLease,
}

#[async_trait]
pub(crate) trait ReservationSql: Send + Sync + 'static {
    /// Where write transactions begin: the database's pool.
    type Pool: Sync;

    /// A connection statements run on.
    type Connection: Send;

    /// Opens a write transaction. PostgreSQL: a plain `BEGIN` (rows are locked as they are
    /// touched); SQLite: a write on the pool's writer (`BEGIN IMMEDIATE`, the database write
    /// lock, which stands in for every row lock; queued writes share its COMMIT, each under a
    /// savepoint of its own).
    async fn begin_write(pool: &Self::Pool) -> Result<Self::Write, sqlx::Error>;

    /// A write transaction of this database (statements on `&mut *tx`).
    type Write: crate::db::WriteTransaction + std::ops::DerefMut<Target = Self::Connection>;

    /// Reads one reservation with its current generation of branches.
    async fn load(conn: &mut Self::Connection, id: Uuid)
    -> Result<Option<Reservation>, StoreError>;

    /// Reads one reservation and locks its row until the transaction ends (PostgreSQL:
    /// `FOR UPDATE`; SQLite: the write lock is held already).
    async fn load_locked(
        conn: &mut Self::Connection,
        id: Uuid,
    ) -> Result<Option<Reservation>, StoreError>;

    /// Reads a reservation that must exist (its id comes from a row just read or written).
    async fn load_existing(
        conn: &mut Self::Connection,
        id: Uuid,
    ) -> Result<Reservation, StoreError> {
        Self::load(conn, id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("reservation {id} vanished")))
    }

    /// The reservation as a write left it: what the write's statement answered with
    /// ([`Applied::Written`]'s `read_back`), else read. (A lease taken since changes nothing a
    /// reservation shows.)
    async fn written(
        conn: &mut Self::Connection,
        id: Uuid,
        read_back: Option<Box<Reservation>>,
    ) -> Result<Reservation, StoreError> {
        match read_back {
            Some(after) => Ok(*after),
            None => Self::load_existing(conn, id).await,
        }
    }

    /// Whether `request_id` is the key of the last Extend applied to the reservation.
    async fn repeats_last_extend(
        conn: &mut Self::Connection,
        id: Uuid,
        request_id: &RequestId,
    ) -> Result<bool, StoreError>;

    /// Runs a decided move out of `HELD` ([`LeaveHeld`], described by `decide.rs`): this
    /// database's one statement for it. `Missed` when the row was not as the description
    /// requires (its version, when guarded by it; `HELD` and unexpired by the database clock)
    /// or its payment is recorded as another reservation's further payment (the locked flow
    /// then answers `PaymentTaken`).
    async fn leave_held(
        conn: &mut Self::Connection,
        write: &LeaveHeld,
    ) -> Result<Applied, StoreError>;

    /// `HELD -> CONFIRMING` with `late_payment_honored`: a late payment confirms the lapsed
    /// holds as they are.
    async fn honor_late(conn: &mut Self::Connection, id: Uuid) -> Result<bool, StoreError>;

    /// `HELD -> CANCELLING` ending `EXPIRED`, only if the database clock says the hold lapsed.
    async fn expire_hold(conn: &mut Self::Connection, id: Uuid) -> Result<bool, StoreError>;

    /// Records the payment given to Confirm, unless the reservation has one already.
    async fn record_payment(
        conn: &mut Self::Connection,
        id: Uuid,
        payment: &Payment,
    ) -> Result<(), StoreError>;

    /// Records the reservation's one refund of its payment (a fresh `refund_id`, `PENDING`,
    /// due at once). False if it has a refund already or no payment.
    async fn record_refund(
        conn: &mut Self::Connection,
        id: Uuid,
        reason: &str,
    ) -> Result<bool, StoreError>;

    /// Starts a retake: an `EXPIRED` reservation with no payment yet moves its version (the
    /// payment is recorded next). False if it is not so.
    async fn mark_retake(conn: &mut Self::Connection, id: Uuid) -> Result<bool, StoreError>;

    /// Pushes a `HELD` reservation's `expires_at` out by `by`, while the database clock is
    /// before it, counting the extension and remembering its `request_id`.
    async fn extend_held(
        conn: &mut Self::Connection,
        id: Uuid,
        by: Duration,
        request_id: Option<&RequestId>,
    ) -> Result<bool, StoreError>;

    /// Leases a reservation to `lease.owner` (it is about to drive it), unless another instance
    /// holds an unexpired lease on it (it is driving it already). True if the lease is ours.
    async fn take_lease(
        conn: &mut Self::Connection,
        id: Uuid,
        lease: WorkLease,
    ) -> Result<bool, StoreError>;

    /// `QUEUED -> CANCELLED` with the Cancel's reason (the row leaves its queues by the
    /// `reservations_left_queues` trigger). True if it was `QUEUED`.
    async fn leave_queue(
        conn: &mut Self::Connection,
        id: Uuid,
        reason: Option<&str>,
    ) -> Result<bool, StoreError>;

    /// Records each participant's answer on its branch rows (`attempts` counted).
    async fn apply_reports(
        conn: &mut Self::Connection,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<(), StoreError>;

    /// An `EXPIRED` reservation gets its next generation and `expires_at = now + ttl`; answers
    /// the new generation, or `None` if the reservation is not `EXPIRED`.
    async fn renew_generation(
        conn: &mut Self::Connection,
        id: Uuid,
    ) -> Result<Option<i32>, StoreError>;

    /// Copies the previous generation's branches into `generation`: same holds, same order,
    /// `PENDING`, a fresh branch id per participant (new TCC branches).
    async fn insert_retake_branches(
        conn: &mut Self::Connection,
        id: Uuid,
        generation: i32,
    ) -> Result<(), StoreError>;

    /// `EXPIRED -> CONFIRMING` with `late_payment_honored`, unless a refund was recorded.
    async fn honor_retake(conn: &mut Self::Connection, id: Uuid) -> Result<bool, StoreError>;

    /// `EXPIRED -> CANCELLING` ending `EXPIRED`, unless a refund was recorded.
    async fn release_retake(conn: &mut Self::Connection, id: Uuid) -> Result<bool, StoreError>;

    /// Records a refund call's outcome on a `PENDING` refund: `REFUNDED`, `FAILED` with the
    /// refusal, or the next attempt by `backoff` (with jitter); the lease is given up either way.
    async fn record_refund_attempt(
        conn: &mut Self::Connection,
        id: Uuid,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<(), StoreError>;
}

/// The statements of payment bindings and further payments (`extra_payments`), one
/// implementation per database (`postgres/payments.rs`, `sqlite/payments.rs`); the flows built
/// from them are in `decide.rs` and `extra.rs`.
#[async_trait]
pub(crate) trait PaymentSql: ReservationSql {
    /// The reservation `payment` (participant, payment_ref) is recorded on, as its own payment
    /// or as a further one, if any.
    async fn payment_owner(
        conn: &mut Self::Connection,
        payment: &Payment,
    ) -> Result<Option<Uuid>, StoreError>;

    /// Records a further payment of reservation `id` with its refund (a fresh `refund_id`,
    /// `PENDING`, due at once), unless that payment is recorded as a further payment already
    /// (of any reservation). True if inserted.
    async fn insert_extra_payment(
        conn: &mut Self::Connection,
        id: Uuid,
        payment: &Payment,
        reason: &str,
    ) -> Result<bool, StoreError>;

    /// A further payment by its (participant, payment_ref), with the reservation it is on.
    async fn load_extra_payment(
        conn: &mut Self::Connection,
        payment: &Payment,
    ) -> Result<Option<(Uuid, ExtraPayment)>, StoreError>;

    /// The further payments of reservation `id` whose refund is still `PENDING`, oldest first.
    async fn pending_extra_payments(
        conn: &mut Self::Connection,
        id: Uuid,
    ) -> Result<Vec<ExtraPayment>, StoreError>;

    /// Records a refund call's outcome on a `PENDING` further payment: `REFUNDED`, `FAILED`
    /// with the refusal, or the next attempt by `backoff` (with jitter).
    async fn record_extra_refund_attempt(
        conn: &mut Self::Connection,
        extra: &ExtraPayment,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<(), StoreError>;

    /// Gives up the lease on reservation `id` if it is in a terminal state (a sweep claimed it
    /// only for its refunds) - not while a late payment is being honoured (`EXPIRED` with a
    /// payment and no refund: a retake, whose lease recovery would take for an abandoned one).
    async fn release_terminal_lease(
        conn: &mut Self::Connection,
        id: Uuid,
    ) -> Result<(), StoreError>;
}
