//! Subscribe on both databases: a reader resuming after any sequence gets exactly the rest,
//! then live events, each event's branches as its change left them; each filter picks its
//! events and a reader whose filter matches nothing still moves on; heartbeats while nothing
//! happens; GetLatestSequence; bad input.

use std::time::Duration;

use holdfast::proto;
use holdfast::proto::branch::State as BranchState;
use holdfast::proto::event::Type;
use tonic::Code;

use super::{
    Database, EventsApp, events_through, events_until, next, on_both_databases, subscribe, type_of,
};
use crate::common::{Decide, hold, reserve_request, settings, spawn_fakes};

on_both_databases!(
    resume_from_any_sequence_gives_exactly_the_rest_then_live_events,
    filters_pick_their_events_and_a_filtered_reader_still_moves_on,
    heartbeats_come_while_nothing_happens,
    bad_requests_are_invalid_argument_naming_the_field,
);

/// The reservations of [`scripted_run`].
struct Script {
    /// alice's, on seats, labelled shop=eu: confirmed.
    confirmed: proto::Reservation,
    /// bob's, on rooms, labelled shop=us: cancelled.
    cancelled: proto::Reservation,
    /// carol's, on seats and rooms: still held, the last of the run.
    held: proto::Reservation,
}

async fn reserve(
    app: &EventsApp,
    id: &str,
    holder: &str,
    shop: &str,
    holds: Vec<proto::Hold>,
) -> proto::Reservation {
    let mut request = reserve_request(id, holds);
    request.holder = holder.to_owned();
    request.labels = [("shop".to_owned(), shop.to_owned())].into();
    app.coordinator
        .clone()
        .reserve(request)
        .await
        .unwrap()
        .into_inner()
}

async fn scripted_run(app: &EventsApp) -> Script {
    let mut c = app.coordinator.clone();
    let confirmed = reserve(app, "e-1", "alice", "eu", vec![hold("seats", "A1")]).await;
    c.confirm(Decide::on(&confirmed).confirm()).await.unwrap();
    let cancelled = reserve(app, "e-2", "bob", "us", vec![hold("rooms", "R1")]).await;
    c.cancel(Decide::on(&cancelled).cancel()).await.unwrap();
    let both = vec![hold("seats", "A2"), hold("rooms", "R2")];
    let held = reserve(app, "e-3", "carol", "eu", both).await;
    Script {
        confirmed,
        cancelled,
        held,
    }
}

/// A coordinator with the fakes `seats` and `rooms` (kept as long as the app).
async fn start(
    database: Database,
    configure: impl FnOnce(&mut holdfast::app::CoordinatorSettings),
) -> (EventsApp, crate::common::Fakes) {
    let fakes = spawn_fakes(&["seats", "rooms"]).await;
    let mut s = settings(&[
        ("seats", &fakes.get("seats").url),
        ("rooms", &fakes.get("rooms").url),
    ]);
    configure(&mut s);
    (database.start(s).await, fakes)
}

/// Every event of the run, read from the start until carol's hold.
async fn whole_log(app: &EventsApp, script: &Script) -> Vec<proto::Event> {
    let mut stream = subscribe(&app.events, 0, None, None).await;
    events_until(&mut stream, &script.held.id, Type::ReservationHeld).await
}

fn ids(events: &[proto::Event]) -> Vec<(i64, String)> {
    events
        .iter()
        .map(|e| (e.sequence, e.event_id.clone()))
        .collect()
}

fn types_of(events: &[proto::Event], reservation: &proto::Reservation) -> Vec<Type> {
    events
        .iter()
        .filter(|e| {
            e.reservation
                .as_ref()
                .is_some_and(|r| r.id == reservation.id)
        })
        .map(type_of)
        .collect()
}

/// Each of `reservation`'s events: its type and its branches' states.
fn branch_states_of(
    events: &[proto::Event],
    reservation: &proto::Reservation,
) -> Vec<(Type, Vec<BranchState>)> {
    events
        .iter()
        .filter_map(|e| {
            let r = e.reservation.as_ref().filter(|r| r.id == reservation.id)?;
            Some((type_of(e), r.branches.iter().map(|b| b.state()).collect()))
        })
        .collect()
}

async fn latest(app: &EventsApp) -> i64 {
    app.events
        .clone()
        .get_latest_sequence(proto::GetLatestSequenceRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sequence
}

async fn resume_from_any_sequence_gives_exactly_the_rest_then_live_events(database: Database) {
    let (app, _fakes) = start(database, |_| {}).await;
    assert_eq!(latest(&app).await, 0, "an empty log");
    let script = scripted_run(&app).await;
    let mut live = subscribe(&app.events, 0, None, None).await;
    let all = events_until(&mut live, &script.held.id, Type::ReservationHeld).await;
    assert!(
        all.windows(2).all(|w| w[0].sequence < w[1].sequence),
        "{:?}",
        ids(&all)
    );
    assert_eq!(
        types_of(&all, &script.confirmed),
        [
            Type::ReservationTrying,
            Type::ReservationHeld,
            Type::ReservationConfirming,
            Type::ReservationConfirmed
        ]
    );
    assert_eq!(
        types_of(&all, &script.cancelled).last(),
        Some(&Type::ReservationCancelled)
    );
    // Read after the Confirm, each event still shows the branches as its change left them.
    assert_eq!(
        branch_states_of(&all, &script.confirmed),
        [
            (Type::ReservationTrying, vec![BranchState::Pending]),
            (Type::ReservationHeld, vec![BranchState::Held]),
            (Type::ReservationConfirming, vec![BranchState::Held]),
            (Type::ReservationConfirmed, vec![BranchState::Confirmed]),
        ]
    );
    assert_eq!(
        branch_states_of(&all, &script.cancelled)[..2],
        [
            (Type::ReservationTrying, vec![BranchState::Pending]),
            (Type::ReservationHeld, vec![BranchState::Held]),
        ]
    );
    let held = all.last().unwrap();
    assert_eq!(held.owner, "", "authentication is off");
    assert!(held.event_id.parse::<uuid::Uuid>().is_ok());
    assert!(held.reservation.as_ref().unwrap().hold_token.is_empty());
    let last = held.sequence;
    assert_eq!(latest(&app).await, last);
    for (i, from) in all.iter().enumerate() {
        let mut resumed = subscribe(&app.events, from.sequence, None, None).await;
        let rest = events_through(&mut resumed, last).await;
        assert_eq!(ids(&rest), ids(&all[i + 1..]), "after {}", from.sequence);
    }
    // Live after the backlog: the next reservation's events follow on the same stream.
    let more = reserve(&app, "e-4", "dave", "eu", vec![hold("seats", "A4")]).await;
    let after = events_until(&mut live, &more.id, Type::ReservationHeld).await;
    assert_eq!(
        types_of(&after, &more),
        [Type::ReservationTrying, Type::ReservationHeld]
    );
    assert!(after[0].sequence > last);
}

/// Which events of the whole log a filter should pick.
type Wanted = Box<dyn Fn(&proto::Event) -> bool>;

async fn filters_pick_their_events_and_a_filtered_reader_still_moves_on(database: Database) {
    let (app, _fakes) = start(database, |_| {}).await;
    let script = scripted_run(&app).await;
    let all = whole_log(&app, &script).await;
    let last = all.last().unwrap().sequence;
    let reservation = |e: &proto::Event| e.reservation.clone().unwrap();
    let cases: Vec<(proto::EventFilter, Wanted)> = vec![
        (
            proto::EventFilter {
                holders: vec!["alice".into(), "nobody".into()],
                ..Default::default()
            },
            Box::new(move |e| reservation(e).holder == "alice"),
        ),
        (
            proto::EventFilter {
                labels: [("shop".to_owned(), "us".to_owned())].into(),
                ..Default::default()
            },
            Box::new(move |e| reservation(e).labels["shop"] == "us"),
        ),
        (
            proto::EventFilter {
                types: vec![
                    Type::ReservationHeld as i32,
                    Type::ReservationCancelled as i32,
                ],
                ..Default::default()
            },
            Box::new(|e| {
                matches!(
                    type_of(e),
                    Type::ReservationHeld | Type::ReservationCancelled
                )
            }),
        ),
        (
            proto::EventFilter {
                participants: vec!["rooms".into()],
                ..Default::default()
            },
            Box::new(move |e| {
                reservation(e)
                    .branches
                    .iter()
                    .any(|b| b.participant == "rooms")
            }),
        ),
        (
            proto::EventFilter {
                holders: vec!["nobody".into()],
                ..Default::default()
            },
            Box::new(|_| false),
        ),
    ];
    for (filter, wanted) in cases {
        let expected: Vec<proto::Event> = all.iter().filter(|e| wanted(e)).cloned().collect();
        let mut stream = subscribe(&app.events, 0, Some(filter.clone()), None).await;
        // The heartbeat at or past the last event: the reader moved past what it did not want.
        let got = events_through(&mut stream, last).await;
        assert_eq!(ids(&got), ids(&expected), "{filter:?}");
    }
}

async fn heartbeats_come_while_nothing_happens(database: Database) {
    let (app, _fakes) = start(database, |s| {
        s.policy.events_heartbeat = Duration::from_millis(100);
    })
    .await;
    let mut stream = subscribe(&app.events, 0, None, None).await;
    for _ in 0..3 {
        let beat = next(&mut stream).await;
        assert_eq!((type_of(&beat), beat.sequence), (Type::Heartbeat, 0));
        assert!(beat.reservation.is_none() && beat.event_id.is_empty());
    }
    let held = reserve(&app, "hb-1", "erin", "eu", vec![hold("seats", "A1")]).await;
    let got = events_until(&mut stream, &held.id, Type::ReservationHeld).await;
    let beat = loop {
        let e = next(&mut stream).await;
        if type_of(&e) == Type::Heartbeat {
            break e;
        }
    };
    assert_eq!(beat.sequence, got.last().unwrap().sequence);
}

async fn bad_requests_are_invalid_argument_naming_the_field(database: Database) {
    let (app, _fakes) = start(database, |_| {}).await;
    let names = |n: usize| (0..n).map(|i| format!("h{i}")).collect::<Vec<_>>();
    let cases = [
        (-1, proto::EventFilter::default(), "after_sequence"),
        (
            0,
            proto::EventFilter {
                types: vec![Type::ReservationHeld as i32, Type::Heartbeat as i32],
                ..Default::default()
            },
            "filter.types[1]",
        ),
        (
            0,
            proto::EventFilter {
                types: vec![Type::Unspecified as i32],
                ..Default::default()
            },
            "filter.types[0]",
        ),
        (
            0,
            proto::EventFilter {
                holders: names(65),
                ..Default::default()
            },
            "filter.holders",
        ),
        (
            0,
            proto::EventFilter {
                participants: names(65),
                ..Default::default()
            },
            "filter.participants",
        ),
        (
            0,
            proto::EventFilter {
                labels: names(17).into_iter().map(|n| (n.clone(), n)).collect(),
                ..Default::default()
            },
            "filter.labels",
        ),
    ];
    for (after, filter, field) in cases {
        let refused = app
            .events
            .clone()
            .subscribe(proto::SubscribeRequest {
                after_sequence: after,
                filter: Some(filter),
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert_eq!(crate::common::reason(&refused), "INVALID_ARGUMENT");
        assert_eq!(crate::common::error_metadata(&refused)["field"], field);
    }
}
