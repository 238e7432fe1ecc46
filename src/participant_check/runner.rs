//! The list of cases and the run: one case after another (each on its own branches and,
//! when the participant creates resources, its own resource), each bounded by a deadline,
//! each ending as a [`Row`].

use std::future::Future;

use super::cases::{self, Ctx, Step, Stop};
use super::report::{Report, Row, Verdict};
use super::subject::{Subject, case_deadline, describe_status};

/// One conformance case: its name in the report, what it expects, whether it needs a known
/// capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    pub name: &'static str,
    pub expected: &'static str,
    needs_capacity: bool,
}

const fn case(name: &'static str, expected: &'static str) -> Case {
    Case {
        name,
        expected,
        needs_capacity: false,
    }
}

/// Every case, in the order they run.
pub const CASES: &[Case] = &[
    // First: on a resource the checker cannot create, --capacity is what is free before
    // the later cases confirm some of it.
    Case {
        name: "concurrent-trys",
        expected: "of twice as many concurrent Trys as fit, at most capacity/quantity HELD; counts within capacity",
        needs_capacity: true,
    },
    Case {
        name: "past-capacity",
        expected: "a Try beyond a full resource REJECTED, nothing changed; repeated after release still REJECTED",
        needs_capacity: true,
    },
    case(
        "try-confirm",
        "Try HELD, Confirm CONFIRMED; the units held, then confirmed",
    ),
    case(
        "try-cancel",
        "Try HELD, Cancel CANCELLED; nothing held after",
    ),
    case(
        "repeat-try-cancel",
        "Try and Cancel each sent twice answer the same twice; held once, released once",
    ),
    case(
        "repeat-confirm",
        "Confirm sent twice answers CONFIRMED twice, a later Try HELD (its first answer); confirmed once",
    ),
    case(
        "cancel-before-try",
        "Cancel first CANCELLED; the late Try (and its repeat) REJECTED; Confirm CANCELLED; nothing held",
    ),
    case(
        "confirm-after-cancel",
        "Try HELD, Cancel CANCELLED, Confirm refused: CANCELLED; nothing confirmed",
    ),
    case(
        "cancel-after-confirm",
        "Try HELD, Confirm CONFIRMED, Cancel refused: CONFIRMED; still confirmed",
    ),
    case(
        "unknown-branch",
        "Confirm (and its repeat) and Extend of unknown branches HOLD_LOST; nothing held",
    ),
    case(
        "extend",
        "Extend of a held branch HELD (repeat too); after Cancel, Extend CANCELLED",
    ),
    case(
        "expires-at-past",
        "expires_at 5 s ago: REJECTED or INVALID_ARGUMENT holding nothing, or HELD and then confirmable",
    ),
    case(
        "expires-at-too-far",
        "expires_at 10 years ahead: INVALID_ARGUMENT naming expires_at; nothing held",
    ),
    case(
        "invalid-try",
        "no ids, no items, quantity 0, no resource, no expires_at: each INVALID_ARGUMENT naming the field",
    ),
    case(
        "garbage-bytes",
        "bytes that are no protobuf: an error status, and the participant still answers",
    ),
];

/// Runs the case called `name` in `c`.
async fn dispatch(name: &str, c: &mut Ctx<'_>) -> Step {
    match name {
        "try-confirm" => cases::lifecycle::try_confirm(c).await,
        "try-cancel" => cases::lifecycle::try_cancel(c).await,
        "repeat-try-cancel" => cases::lifecycle::repeat_try_cancel(c).await,
        "repeat-confirm" => cases::lifecycle::repeat_confirm(c).await,
        "extend" => cases::lifecycle::extend(c).await,
        "cancel-before-try" => cases::disorder::cancel_before_try(c).await,
        "confirm-after-cancel" => cases::disorder::confirm_after_cancel(c).await,
        "cancel-after-confirm" => cases::disorder::cancel_after_confirm(c).await,
        "unknown-branch" => cases::disorder::unknown_branch(c).await,
        "concurrent-trys" => cases::capacity::concurrent_trys(c).await,
        "past-capacity" => cases::capacity::past_capacity(c).await,
        "expires-at-past" => cases::input::expires_at_past(c).await,
        "expires-at-too-far" => cases::input::expires_at_too_far(c).await,
        "invalid-try" => cases::input::invalid_try(c).await,
        "garbage-bytes" => cases::input::garbage_bytes(c).await,
        _ => Err(Stop::Skip(format!("no case called {name}"))),
    }
}

/// Runs every case against `subject`, in order.
pub(crate) async fn run_all(subject: &Subject) -> Report {
    let mut rows = Vec::new();
    for case in CASES {
        rows.push(run_case(subject, case).await);
    }
    Report {
        participant: subject.args.target.url.clone(),
        resource: subject.args.resource.clone(),
        notes: subject.notes.clone(),
        rows,
    }
}

async fn run_case(subject: &Subject, case: &Case) -> Row {
    let row = |verdict, got: String| Row {
        case: case.name,
        expected: case.expected,
        got,
        verdict,
    };
    if case.needs_capacity
        && let Some(why) = &subject.capacity_unknown
    {
        return row(Verdict::Skipped, why.clone());
    }
    let (resource, n) = match subject.resource_for_case().await {
        Ok(r) => r,
        Err(s) => {
            return row(
                Verdict::Fail,
                format!("PutResources {}", describe_status(&s)),
            );
        }
    };
    let mut ctx = match Ctx::new(subject, resource, n).await {
        Ok(c) => c,
        Err(s) => {
            return row(
                Verdict::Fail,
                format!("GetResource {}", describe_status(&s)),
            );
        }
    };
    let deadline = case_deadline(subject.args.target.timeout);
    let ended = bounded(deadline, dispatch(case.name, &mut ctx)).await;
    let trail = ctx.trail.join(", ");
    match ended {
        Some(Ok(())) => row(Verdict::Pass, trail),
        Some(Err(Stop::Fail)) => row(Verdict::Fail, trail),
        Some(Err(Stop::Skip(why))) => row(Verdict::Skipped, why),
        None => row(
            Verdict::Fail,
            format!("{trail} ... no end within {}s", deadline.as_secs()),
        ),
    }
}

/// `f`, or `None` when it takes longer than `deadline`.
async fn bounded<T>(deadline: std::time::Duration, f: impl Future<Output = T>) -> Option<T> {
    tokio::time::timeout(deadline, f).await.ok()
}
