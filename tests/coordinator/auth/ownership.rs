//! Each reservation belongs to the principal that made it (SPEC 7.2): for another client it
//! does not exist - not by Get, Watch, Confirm, Cancel or Extend (even with the right token),
//! not in List, not through a replay of its Reserve - and nothing about it changes; an admin
//! sees everyone's; idempotency and hold limits are per principal.

use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::Code;

use super::{Cast, keyed, refusal, reserve_seat, secured_shop};
use crate::common::{Decide, state_of};

fn not_found(status: &tonic::Status) {
    assert_eq!(
        refusal(status),
        (Code::NotFound, "RESERVATION_NOT_FOUND".to_owned()),
        "{status:?}"
    );
}

#[sqlx::test(migrations = false)]
async fn a_stranger_can_neither_see_nor_replay_nor_change_another_principals_reservation(
    pool: PgPool,
) {
    let cast = Cast::new();
    let (app, seats) = secured_shop(pool, &cast).await;
    let mut c = app.client.clone();
    let body = reserve_seat("order-1", "alice", "A1");
    let mine = c
        .reserve(keyed(body.clone(), &cast.shop.key))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&mine), State::Held);
    assert_eq!(mine.hold_token.len(), 64);

    // The stranger lists nothing...
    let listed = c
        .list_reservations(keyed(
            proto::ListReservationsRequest::default(),
            &cast.stranger.key,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(listed.reservations.is_empty(), "{listed:?}");
    // ...replaying the whole Reserve body is a Reserve of its own: never the shop's
    // reservation or token (the seat is taken, so it is refused).
    match c.reserve(keyed(body.clone(), &cast.stranger.key)).await {
        Ok(theirs) => {
            let theirs = theirs.into_inner();
            assert_ne!(theirs.id, mine.id);
            assert_ne!(theirs.hold_token, mine.hold_token);
        }
        Err(status) => {
            assert_eq!(crate::common::reason(&status), "INSUFFICIENT_CAPACITY");
            let meta = crate::common::error_metadata(&status);
            assert_ne!(meta.get("reservation_id"), Some(&mine.id));
        }
    }
    // ...and every call on the shop's reservation answers NOT_FOUND, even with the right token.
    let on = Decide::on(&mine);
    let get = proto::GetReservationRequest {
        reservation_id: mine.id.clone(),
    };
    not_found(
        &c.get_reservation(keyed(get.clone(), &cast.stranger.key))
            .await
            .unwrap_err(),
    );
    let watch = proto::WatchReservationRequest {
        reservation_id: mine.id.clone(),
    };
    not_found(
        &c.watch_reservation(keyed(watch, &cast.stranger.key))
            .await
            .unwrap_err(),
    );
    not_found(
        &c.cancel(keyed(on.cancel(), &cast.stranger.key))
            .await
            .unwrap_err(),
    );
    not_found(
        &c.extend(keyed(on.extend(None, ""), &cast.stranger.key))
            .await
            .unwrap_err(),
    );
    not_found(
        &c.confirm(keyed(on.confirm(), &cast.stranger.key))
            .await
            .unwrap_err(),
    );
    // A wrong token looks the same as a missing reservation to the stranger.
    not_found(
        &c.cancel(keyed(
            Decide::with_token(&mine.id, "x").cancel(),
            &cast.stranger.key,
        ))
        .await
        .unwrap_err(),
    );

    // Nothing changed: the shop's reservation is as it was, the seat still held once.
    let after = c
        .get_reservation(keyed(get, &cast.shop.key))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&after), State::Held);
    assert_eq!(after.expires_at, mine.expires_at);
    assert_eq!(after.extensions_used, 0);
    let a1 = super::resource_as(&seats, "A1", &cast.admin.key).await;
    assert_eq!((a1.held, a1.confirmed), (1, 0));
    // The owner still can.
    c.confirm(keyed(on.confirm(), &cast.shop.key))
        .await
        .unwrap();
}

#[sqlx::test(migrations = false)]
async fn list_shows_a_client_its_own_and_an_admin_everyones(pool: PgPool) {
    let cast = Cast::new();
    let (app, _seats) = secured_shop(pool, &cast).await;
    let mut c = app.client.clone();
    let shops = c
        .reserve(keyed(reserve_seat("o-1", "alice", "A1"), &cast.shop.key))
        .await
        .unwrap()
        .into_inner();
    let strangers = c
        .reserve(keyed(
            reserve_seat("o-1", "alice", "A2"),
            &cast.stranger.key,
        ))
        .await
        .unwrap()
        .into_inner();
    let list = |key: String, holder: &str| {
        let mut c = c.clone();
        let req = proto::ListReservationsRequest {
            holder: holder.to_owned(),
            ..Default::default()
        };
        async move {
            let ids: Vec<String> = c
                .list_reservations(keyed(req, &key))
                .await
                .unwrap()
                .into_inner()
                .reservations
                .into_iter()
                .map(|r| {
                    assert!(r.hold_token.is_empty(), "List never shows a token");
                    r.id
                })
                .collect();
            ids
        }
    };
    assert_eq!(
        list(cast.shop.key.clone(), "").await,
        vec![shops.id.clone()]
    );
    assert_eq!(
        list(cast.shop.key.clone(), "alice").await,
        vec![shops.id.clone()]
    );
    assert_eq!(
        list(cast.stranger.key.clone(), "").await,
        vec![strangers.id.clone()]
    );
    let mut all = list(cast.admin.key.clone(), "alice").await;
    all.sort();
    let mut both = vec![shops.id.clone(), strangers.id.clone()];
    both.sort();
    assert_eq!(all, both);
    // An admin reads (and may release) anyone's.
    let got = c
        .get_reservation(keyed(
            proto::GetReservationRequest {
                reservation_id: shops.id.clone(),
            },
            &cast.admin.key,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.id, shops.id);
}

#[sqlx::test(migrations = false)]
async fn the_same_request_id_and_holder_limits_are_per_principal(pool: PgPool) {
    let cast = Cast::new();
    let mut s = super::secured_settings(&cast, &[]);
    s.policy.hold_limits.per_holder = 1;
    let seats = crate::common::spawn_participant_with(
        holdfast::participants::ParticipantSettings {
            auth: cast.file.authenticator(),
            ..holdfast::participants::ParticipantSettings::new(holdfast::participants::Kind::Seats)
        },
        &pool,
    )
    .await;
    crate::common::admin(&seats)
        .await
        .put_resources(keyed(
            crate::common::put_resources_request(&[("A1", 1), ("A2", 1), ("A3", 1)]),
            &cast.admin.key,
        ))
        .await
        .unwrap();
    s.participants = vec![holdfast::registry::ParticipantEndpoint {
        name: "seats".into(),
        url: seats.clone(),
        timeout: std::time::Duration::from_secs(2),
    }];
    let app = crate::common::spawn_app(pool, s).await;
    let mut c = app.client.clone();
    let first = c
        .reserve(keyed(reserve_seat("o-1", "alice", "A1"), &cast.shop.key))
        .await
        .unwrap()
        .into_inner();
    // A repeat by the same principal answers the same reservation and token.
    let again = c
        .reserve(keyed(reserve_seat("o-1", "alice", "A1"), &cast.shop.key))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (again.id.as_str(), again.hold_token.as_str()),
        (first.id.as_str(), first.hold_token.as_str())
    );
    // The shop's "alice" is at her limit of 1...
    let limited = c
        .reserve(keyed(reserve_seat("o-2", "alice", "A2"), &cast.shop.key))
        .await
        .unwrap_err();
    assert_eq!(
        refusal(&limited),
        (Code::ResourceExhausted, "HOLD_LIMIT_EXCEEDED".to_owned())
    );
    // ...but another principal's "alice" with the same request id is someone else.
    let other = c
        .reserve(keyed(
            reserve_seat("o-1", "alice", "A3"),
            &cast.stranger.key,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(other.id, first.id);
    assert_eq!(state_of(&other), State::Held);
}
