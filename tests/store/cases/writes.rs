//! Every write answers with its after-image: each answer equals a later read, alone and when
//! many concurrent writes are group-committed into shared statements.

use crate::parallel::{leave_after_first_poll, together};
use holdfast::domain::LatePaymentPolicy;
use holdfast::domain::{BranchState, Rejection, State};
use holdfast::store::{BranchReport, Created, Decided};

use super::{
    FAST, LONG, NO_LIMITS, S, SLOW, cancel, confirm, confirm_paid, create, decide, get, held,
    lease, new_res, payment, reports,
};

/// Every write answers with the reservation exactly as a later read sees it (the Postgres store
/// builds these answers in the write's own statement rather than reading again).
pub async fn writes_answer_with_the_stored_reservation(store: S) {
    let (r, token) = create(&store, "alice", "req-1", LONG).await;
    assert_eq!(r, get(&store, r.id).await, "create");
    assert_eq!(r.branches.len(), 3);
    let placed = store
        .record_held(r.id, &reports(&r, BranchState::Held, None))
        .await
        .unwrap();
    assert_eq!(placed, get(&store, r.id).await, "record_held");
    let (_, confirming, _) = decide(
        &store,
        r.id,
        &token,
        &confirm_paid(LatePaymentPolicy::HonorIfAvailable),
    )
    .await;
    assert_eq!(confirming.state, State::Confirming);
    assert_eq!(confirming.payment, Some(payment()));
    assert_eq!(confirming, get(&store, r.id).await, "decide");
    // One participant answers, the other does not: the unreported branch keeps its row.
    let groups = r.participant_branches();
    let first = BranchReport {
        branch_id: groups[0].branch_id,
        state: BranchState::Confirmed,
        error: None,
    };
    let second = BranchReport {
        branch_id: groups[1].branch_id,
        state: BranchState::Held,
        error: Some("unreachable".into()),
    };
    let phase = store
        .record_phase(r.id, State::Confirming, &[first], None, SLOW)
        .await
        .unwrap();
    assert!(!phase.finished);
    assert_eq!(phase.reservation, get(&store, r.id).await, "record_phase");
    let states: Vec<BranchState> = phase.reservation.branches.iter().map(|b| b.state).collect();
    assert_eq!(
        states,
        [BranchState::Confirmed, BranchState::Held, BranchState::Held]
    );
    let phase = store
        .record_phase(r.id, State::Confirming, &[second], None, SLOW)
        .await
        .unwrap();
    assert_eq!(phase.reservation, get(&store, r.id).await, "record_phase");
    assert_eq!(
        phase.reservation.branches[2].last_error.as_deref(),
        Some("unreachable")
    );
    let phase = store
        .record_phase(
            r.id,
            State::Confirming,
            &reports(&r, BranchState::Confirmed, None)[1..],
            Some(State::Confirmed),
            FAST,
        )
        .await
        .unwrap();
    assert!(phase.finished);
    assert_eq!(phase.reservation.state, State::Confirmed);
    assert_eq!(phase.reservation, get(&store, r.id).await, "record_phase");
    // A cancel of another held reservation: the same.
    let (r2, token2) = held(&store, "alice", "req-2", LONG).await;
    let (_, cancelling, _) = decide(&store, r2.id, &token2, &cancel()).await;
    assert_eq!(cancelling.state, State::Cancelling);
    assert_eq!(cancelling, get(&store, r2.id).await, "decide cancel");
}

/// Confirms of 40 held reservations at once, every other caller leaving as soon as its call
/// has started (a Confirm whose client is gone), five bursts: every caller that stays is
/// answered `CONFIRMING`, whatever the writes group-committed beside its own did, and a
/// reservation whose caller left is either as it was or moved whole.
pub async fn callers_that_leave_fail_no_other_write(store: S) {
    for burst in 0..5 {
        confirms_half_left_behind(&store, burst).await;
    }
}

/// One burst of [`callers_that_leave_fail_no_other_write`].
async fn confirms_half_left_behind(store: &S, burst: usize) {
    const N: usize = 40;
    let placed = together((0..N).map(|i| {
        let store = store.clone();
        async move {
            held(
                &store,
                &format!("holder-{i}"),
                &format!("req-{burst}"),
                LONG,
            )
            .await
        }
    }))
    .await;
    let answers = together(placed.iter().enumerate().map(|(i, (r, token))| {
        let (store, id, token) = (store.clone(), r.id, token.clone());
        async move {
            let call = async { store.decide(id, None, &token, &confirm(), lease()).await };
            if i % 2 == 0 {
                leave_after_first_poll(call).await;
                None
            } else {
                Some(call.await)
            }
        }
    }))
    .await;
    for ((r, _), answer) in placed.iter().zip(answers) {
        let now = get(store, r.id).await;
        let Some(answer) = answer else {
            assert!(
                now == *r || (now.state == State::Confirming && now.version > r.version),
                "a write whose caller left is whole or not at all: {now:?}"
            );
            continue;
        };
        match answer {
            Ok(Decided::Judged { reservation, .. }) => {
                assert_eq!(reservation.state, State::Confirming);
                assert_eq!(*reservation, now);
            }
            other => panic!("a caller that stayed was not answered its Confirm: {other:?}"),
        }
    }
}

/// Many concurrent `record_held` and `record_phase` calls (the Postgres store group-commits
/// them into shared statements): each is recorded as if alone, each answer is its own
/// reservation as stored, a repeat and a call from the wrong state change nothing.
pub async fn concurrent_writes_are_each_recorded(store: S) {
    const N: usize = 40;
    // Reserves of 40 holders at once, plus a repeat of the first one's request in the burst.
    let answers = together((0..=N).map(|i| {
        let store = store.clone();
        async move {
            let holder = format!("holder-{}", i % N);
            store
                .create(&new_res(&holder, "req", LONG), lease(), NO_LIMITS)
                .await
                .unwrap()
        }
    }))
    .await;
    let (mut created, mut existing) = (Vec::new(), Vec::new());
    for answer in answers {
        match answer {
            Created::New(r) => created.push(r),
            Created::Existing(r) => existing.push(r),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((created.len(), existing.len()), (N, 1));
    assert_eq!(existing[0].holder, "holder-0");
    assert!(created.iter().any(|r| r.id == existing[0].id));
    for r in &created {
        assert_eq!(r, &get(&store, r.id).await);
        assert_eq!(r.branches.len(), 3);
    }
    let placed = together(created.iter().map(|r| {
        let (store, r) = (store.clone(), r.clone());
        async move {
            store
                .record_held(r.id, &reports(&r, BranchState::Held, None))
                .await
                .unwrap()
        }
    }))
    .await;
    for (r, after) in created.iter().zip(&placed) {
        assert_eq!(after.id, r.id);
        assert_eq!(after.state, State::Held);
        assert!(after.branches.iter().all(|b| b.state == BranchState::Held));
        assert_eq!(after, &get(&store, r.id).await);
    }
    // Into CONFIRMING (via the store's claim: lease them all as due work is not needed here).
    let mut confirming = Vec::new();
    for r in &placed {
        let token = super::token_of(r.id);
        confirming.push(decide(&store, r.id, &token, &confirm()).await.1);
    }
    // Even ones finish CONFIRMED; odd ones hear from one participant only and stay; the
    // first also gets a repeat and a call from the wrong state in the same burst, the second
    // a second call bringing the other participant's answer (both must be recorded).
    let calls = confirming.iter().enumerate().flat_map(|(i, r)| {
        let mut calls = vec![(i, r.clone(), State::Confirming, 0)];
        if i == 0 {
            calls.push((i, r.clone(), State::Confirming, 0));
            calls.push((i, r.clone(), State::Cancelling, 0));
        }
        if i == 1 {
            calls.push((i, r.clone(), State::Confirming, 1));
        }
        calls
    });
    let answers = together(calls.map(|(i, r, from, part)| {
        let store = store.clone();
        async move {
            let (reports, finish) = if i % 2 == 0 {
                (
                    reports(&r, BranchState::Confirmed, None),
                    Some(State::Confirmed),
                )
            } else {
                (
                    reports(&r, BranchState::Confirmed, None)[part..=part].to_vec(),
                    None,
                )
            };
            let phase = store
                .record_phase(r.id, from, &reports, finish, SLOW)
                .await
                .unwrap();
            (i, from, phase)
        }
    }))
    .await;
    let mut finished_first = 0;
    for (i, from, phase) in answers {
        let r = &confirming[i];
        assert_eq!(phase.reservation.id, r.id);
        if i == 0 {
            finished_first += usize::from(phase.finished);
            if from == State::Cancelling {
                assert!(!phase.finished, "wrong state recorded nothing");
            }
            continue;
        }
        if i == 1 {
            continue;
        }
        assert_eq!(phase.reservation, get(&store, r.id).await);
        if i % 2 == 0 {
            assert!(phase.finished);
            assert_eq!(phase.reservation.state, State::Confirmed);
        } else {
            assert!(!phase.finished);
            assert_eq!(phase.reservation.state, State::Confirming);
            let states: Vec<BranchState> =
                phase.reservation.branches.iter().map(|b| b.state).collect();
            assert_eq!(
                states,
                [BranchState::Confirmed, BranchState::Held, BranchState::Held]
            );
        }
    }
    // Exactly one of the two identical calls finished the first reservation.
    assert_eq!(finished_first, 1);
    let first = get(&store, confirming[0].id).await;
    assert_eq!(first.state, State::Confirmed);
    assert!(first.branches.iter().all(|b| b.attempts == 2));
    let second = get(&store, confirming[1].id).await;
    assert_eq!(second.state, State::Confirming);
    assert!(
        second
            .branches
            .iter()
            .all(|b| b.state == BranchState::Confirmed && b.attempts == 2),
        "both calls recorded: {:?}",
        second.branches
    );
}

/// Many concurrent `record_rejected` calls (the Postgres store group-commits them into shared
/// statements): each is recorded as if alone. A placement refused at its first participant is
/// REJECTED at once; one that held something first is CANCELLING for its release; a repeat in
/// the same burst changes nothing.
pub async fn concurrent_rejections_are_each_recorded(store: S) {
    const N: usize = 40;
    let mut trying = Vec::new();
    for i in 0..N {
        trying.push(create(&store, &format!("holder-{i}"), "req", LONG).await.0);
    }
    let rejection = |i: usize| Rejection {
        participant: "seats".into(),
        resource: format!("A{i}"),
        reason: format!("sold out {i}"),
    };
    // Even ones were refused by their first participant; odd ones held at the first and were
    // refused at the second. The first one's call is made twice.
    let calls = (0..N).chain([0]).map(|i| {
        let (store, r) = (store.clone(), trying[i].clone());
        async move {
            let pbs = r.participant_branches();
            let refused = |k: usize| BranchReport {
                branch_id: pbs[k].branch_id,
                state: BranchState::Rejected,
                error: None,
            };
            let reports = if i % 2 == 0 {
                vec![refused(0)]
            } else {
                vec![
                    BranchReport {
                        branch_id: pbs[0].branch_id,
                        state: BranchState::Held,
                        error: None,
                    },
                    refused(1),
                ]
            };
            let after = store
                .record_rejected(r.id, Some(&rejection(i)), &reports)
                .await
                .unwrap();
            (i, after)
        }
    });
    for (i, after) in together(calls).await {
        let r = &trying[i];
        assert_eq!(after.id, r.id);
        assert_eq!(after, get(&store, r.id).await, "answered as stored");
        assert_eq!(after.version, r.version + 1, "{i}: written once");
        assert_eq!(after.rejection, Some(rejection(i)));
        assert_eq!(after.release_outcome, Some(State::Rejected));
        let states: Vec<BranchState> = after.branches.iter().map(|b| b.state).collect();
        if i % 2 == 0 {
            assert_eq!(after.state, State::Rejected);
            assert_eq!(
                states,
                [
                    BranchState::Rejected,
                    BranchState::Pending,
                    BranchState::Pending
                ]
            );
        } else {
            assert_eq!(after.state, State::Cancelling);
            assert_eq!(
                states,
                [
                    BranchState::Held,
                    BranchState::Rejected,
                    BranchState::Rejected
                ]
            );
        }
        let tried: Vec<i32> = after
            .branches
            .iter()
            .filter(|b| b.state != BranchState::Pending)
            .map(|b| b.attempts)
            .collect();
        assert!(tried.iter().all(|&n| n == 1), "{i}: {tried:?}");
    }
    // Only the odd ones have a release to drive.
    assert_eq!(store.backlog().await.unwrap(), (N / 2) as i64);
}
