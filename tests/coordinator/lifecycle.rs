//! Reserve, Confirm, Cancel, Extend and Watch through their states, including idempotent
//! repeats, closed reservations, wrong tokens and expiry.

use std::time::Duration;

use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::Code;

use crate::common::*;

#[sqlx::test(migrations = false)]
async fn reserve_then_confirm(pool: PgPool) {
    let (mut app, fakes) = spawn_with_fakes(pool, &["seats", "stock"]).await;
    let mut req = reserve_request("r1", vec![hold("seats", "A1"), hold("stock", "sku-9")]);
    req.labels.insert("order".into(), "o-42".into());
    let r = app.client.reserve(req).await.unwrap().into_inner();
    assert_eq!(r.labels.get("order").map(String::as_str), Some("o-42"));
    assert_eq!(state_of(&r), State::Held);
    assert_eq!(r.hold_token.len(), 64, "token carries 256 bits");
    // No ttl given: the default of 10 minutes (SPEC 3.1), by the database clock.
    let (created, expires) = (r.created_at.unwrap(), r.expires_at.unwrap());
    let span_ms = (expires.seconds - created.seconds) * 1000
        + i64::from(expires.nanos - created.nanos) / 1_000_000;
    assert!(
        (599_900..=600_100).contains(&span_ms),
        "default ttl: {span_ms} ms"
    );
    assert_eq!(fakes.get("seats").held(), ["A1"]);
    assert_eq!(fakes.get("stock").held(), ["sku-9"]);

    let c = app
        .client
        .confirm(Decide::on(&r).confirm())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&c), State::Confirmed);
    assert!(c.hold_token.is_empty(), "Confirm never returns the token");
    assert_eq!(
        c.labels.get("order").map(String::as_str),
        Some("o-42"),
        "labels kept"
    );
    assert!(
        c.branches
            .iter()
            .all(|b| b.state == i32::from(proto::branch::State::Confirmed))
    );
    assert_eq!(fakes.get("seats").effects(), (1, 0));
    assert_eq!(fakes.get("stock").effects(), (1, 0));

    // A repeat answers the same, with no further participant effect.
    let again = app
        .client
        .confirm(Decide::on(&r).confirm())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&again), State::Confirmed);
    // Every send counted, not only the ones that changed a state.
    fakes.log.assert_once_per_branch("seats", "Confirm", 1);
    fakes.log.assert_once_per_branch("stock", "Confirm", 1);

    // Cancel after Confirm is refused.
    let err = app
        .client
        .cancel(Decide::on(&r).cancel())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(reason(&err), "RESERVATION_CLOSED");
    assert_eq!(error_metadata(&err)["reservation_id"], r.id);
    assert_eq!(fakes.get("seats").effects(), (1, 0));
}

#[sqlx::test(migrations = false)]
async fn reserve_then_cancel(pool: PgPool) {
    let (mut app, fakes) = spawn_with_fakes(pool, &["seats", "stock"]).await;
    let r = app
        .client
        .reserve(reserve_request(
            "r1",
            vec![hold("seats", "A1"), hold("stock", "sku-9")],
        ))
        .await
        .unwrap()
        .into_inner();
    let cancel = Decide::on(&r).cancel_because("changed my mind");
    let c = app
        .client
        .cancel(cancel.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&c), State::Cancelled);
    assert!(fakes.get("seats").held().is_empty());
    assert!(fakes.get("stock").held().is_empty());
    assert_eq!(fakes.get("seats").effects(), (0, 1));
    fakes.log.assert_once_per_branch("seats", "Cancel", 1);
    fakes.log.assert_once_per_branch("stock", "Cancel", 1);

    let again = app.client.cancel(cancel).await.unwrap().into_inner();
    assert_eq!(state_of(&again), State::Cancelled);
    assert_eq!(
        fakes.log.count("seats", "Cancel"),
        1,
        "a repeat calls no one"
    );

    let err = app
        .client
        .confirm(Decide::on(&r).confirm())
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "RESERVATION_CLOSED");
    assert_eq!(fakes.log.count("seats", "Confirm"), 0);
}

#[sqlx::test(migrations = false)]
async fn reserve_is_idempotent_on_holder_and_request_id(pool: PgPool) {
    let (mut app, fakes) = spawn_with_fakes(pool, &["seats"]).await;
    let req = reserve_request("order-7", vec![hold("seats", "A1"), hold("seats", "A2")]);
    let first = app.client.reserve(req.clone()).await.unwrap().into_inner();
    let second = app.client.reserve(req.clone()).await.unwrap().into_inner();
    assert_eq!(first.id, second.id);
    assert_eq!(
        first.hold_token, second.hold_token,
        "the same token comes back"
    );
    assert_eq!(fakes.log.count("seats", "Try"), 1, "holds placed once");

    // The same holds listed in another order are the same body.
    let mut reordered = req.clone();
    reordered.holds.reverse();
    assert_eq!(
        app.client.reserve(reordered).await.unwrap().into_inner().id,
        first.id
    );

    // Another holder may use the same request_id.
    let mut other_holder = req.clone();
    other_holder.holder = "user-2".into();
    other_holder.holds = vec![hold("seats", "B1")];
    let other = app.client.reserve(other_holder).await.unwrap().into_inner();
    assert_ne!(other.id, first.id);

    // A different body under the same key is refused and changes nothing.
    let mut changed = req.clone();
    changed.holds.push(hold("seats", "A3"));
    let err = app.client.reserve(changed).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert_eq!(reason(&err), "REQUEST_ID_REUSED");
    assert_eq!(error_metadata(&err)["reservation_id"], first.id);
    assert_eq!(fakes.get("seats").held(), ["A1", "A2", "B1"]);

    // Still the same reservation, whatever its state now.
    app.client
        .cancel(Decide::on(&first).cancel())
        .await
        .unwrap();
    let after = app.client.reserve(req).await.unwrap().into_inner();
    assert_eq!(after.id, first.id);
    assert_eq!(state_of(&after), State::Cancelled);
}

/// A ttl with sub-millisecond digits is kept to the millisecond, so an honest retry of the
/// same bytes is a repeat, not REQUEST_ID_REUSED.
#[sqlx::test(migrations = false)]
async fn a_retry_with_a_sub_millisecond_ttl_is_a_repeat(pool: PgPool) {
    let (mut app, fakes) = spawn_with_fakes(pool, &["seats"]).await;
    let mut req = reserve_request("order-ttl", vec![hold("seats", "A1")]);
    req.ttl = Some(prost_types::Duration {
        seconds: 60,
        nanos: 500_999,
    });
    let first = app.client.reserve(req.clone()).await.unwrap().into_inner();
    let again = app.client.reserve(req).await.unwrap().into_inner();
    assert_eq!(again.id, first.id);
    assert_eq!(again.hold_token, first.hold_token);
    assert_eq!(fakes.log.count("seats", "Try"), 1, "holds placed once");
}

#[sqlx::test(migrations = false)]
async fn wrong_token_changes_nothing(pool: PgPool) {
    let (mut app, fakes) = spawn_with_fakes(pool, &["seats"]).await;
    let r = app
        .client
        .reserve(reserve_request("r1", vec![hold("seats", "A1")]))
        .await
        .unwrap()
        .into_inner();
    let mut wrong = r.hold_token.clone();
    wrong.replace_range(0..1, if wrong.starts_with('0') { "1" } else { "0" });
    for token in [wrong.clone(), "x".into()] {
        let err = app
            .client
            .confirm(Decide::with_token(&r.id, &token).confirm())
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied);
        assert_eq!(reason(&err), "HOLD_TOKEN_MISMATCH");
        assert!(!err.message().contains(&r.hold_token), "never echo a token");
        let err = app
            .client
            .cancel(Decide::with_token(&r.id, &token).cancel())
            .await
            .unwrap_err();
        assert_eq!(reason(&err), "HOLD_TOKEN_MISMATCH");
    }
    let now = app
        .client
        .get_reservation(proto::GetReservationRequest {
            reservation_id: r.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&now), State::Held);
    assert_eq!(
        fakes.log.summary(),
        ["seats.Try"],
        "no participant heard of it"
    );
}

#[sqlx::test(migrations = false)]
async fn confirm_after_ttl_ran_out_is_hold_expired(pool: PgPool) {
    // No reaper here: this is lazy expiry, seen by reads and decided by the Confirm itself.
    let fakes = spawn_fakes(&["seats"]).await;
    let mut s = settings(&[("seats", &fakes.get("seats").url)]);
    s.policy.sweep_interval = Duration::from_secs(3600);
    let mut app = spawn_app(pool, s).await;
    let mut req = reserve_request("r1", vec![hold("seats", "A1")]);
    req.ttl = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let r = app.client.reserve(req).await.unwrap().into_inner();
    let get = proto::GetReservationRequest {
        reservation_id: r.id.clone(),
    };
    // Wait for the database clock to pass expires_at: the event under test is time passing.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = app
            .client
            .get_reservation(get.clone())
            .await
            .unwrap()
            .into_inner();
        if state_of(&now) == State::Expired {
            break;
        }
        assert_eq!(state_of(&now), State::Held);
        assert!(
            tokio::time::Instant::now() < deadline,
            "never EXPIRED: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let err = app
        .client
        .confirm(Decide::on(&r).confirm())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(reason(&err), "HOLD_EXPIRED");
    assert_eq!(
        fakes.get("seats").effects(),
        (0, 1),
        "released, never confirmed"
    );
    let now = app.client.get_reservation(get).await.unwrap().into_inner();
    assert_eq!(state_of(&now), State::Expired);

    // Extend after expiry is refused the same way.
    let err = app
        .client
        .extend(Decide::on(&r).extend(None, ""))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "HOLD_EXPIRED");
}

#[sqlx::test(migrations = false)]
async fn extend_once_then_limit(pool: PgPool) {
    let (mut app, _fakes) = spawn_with_fakes(pool, &["seats"]).await;
    let r = app
        .client
        .reserve(reserve_request("r1", vec![hold("seats", "A1")]))
        .await
        .unwrap()
        .into_inner();
    let extend = Decide::on(&r).extend(Some(Duration::from_secs(60)), "");
    let e = app
        .client
        .extend(extend.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(e.extensions_used, 1);
    assert_eq!(
        e.expires_at.unwrap().seconds - r.expires_at.unwrap().seconds,
        60
    );
    let err = app.client.extend(extend).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(reason(&err), "EXTENSION_LIMIT_REACHED");
}

/// SPEC: Extend is idempotent - a retried Extend with the same request_id answers the
/// reservation as the first one left it; without a key each success is another extension.
#[sqlx::test(migrations = false)]
async fn extend_with_a_request_id_is_idempotent(pool: PgPool) {
    let (mut app, _fakes) = spawn_with_fakes(pool, &["seats"]).await;
    let r = app
        .client
        .reserve(reserve_request("r1", vec![hold("seats", "A1")]))
        .await
        .unwrap()
        .into_inner();
    let extend =
        |request_id: &str| Decide::on(&r).extend(Some(Duration::from_secs(60)), request_id);
    let first = app
        .client
        .extend(extend("ext-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.extensions_used, 1);
    for _ in 0..3 {
        let again = app
            .client
            .extend(extend("ext-1"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(again.extensions_used, 1);
        assert_eq!(again.expires_at, first.expires_at);
        assert!(again.hold_token.is_empty(), "never returned after Reserve");
    }
    let err = app.client.extend(extend("ext-2")).await.unwrap_err();
    assert_eq!(reason(&err), "EXTENSION_LIMIT_REACHED");
    // A bad key is refused naming the field, and changes nothing.
    let err = app.client.extend(extend("bad\u{7}key")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("request_id"), "{}", err.message());
    let err = app
        .client
        .extend(extend(&"k".repeat(129)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("request_id"), "{}", err.message());
}

#[sqlx::test(migrations = false)]
async fn watch_streams_changes_and_ends_after_terminal(pool: PgPool) {
    let (mut app, _fakes) = spawn_with_fakes(pool, &["seats"]).await;
    let r = app
        .client
        .reserve(reserve_request("r1", vec![hold("seats", "A1")]))
        .await
        .unwrap()
        .into_inner();
    let mut stream = app
        .client
        .watch_reservation(proto::WatchReservationRequest {
            reservation_id: r.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(state_of(&first), State::Held);
    assert!(first.hold_token.is_empty());
    app.client.confirm(Decide::on(&r).confirm()).await.unwrap();
    let mut seen = vec![];
    while let Some(msg) = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("watch must end after the terminal state")
        .unwrap()
    {
        seen.push(state_of(&msg));
    }
    assert_eq!(seen.last(), Some(&State::Confirmed));
    assert!(
        seen.iter()
            .all(|s| matches!(s, State::Confirming | State::Confirmed))
    );
}
