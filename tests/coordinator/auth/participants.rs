//! Participants accept `tcc.v1.Participant` and refunds only from the `coordinator` role, and
//! resizing only from an admin (SPEC 7.2); the coordinator presents its own key.

use holdfast::proto;
use holdfast::proto::participant_client::ParticipantClient;
use sqlx::PgPool;
use tonic::Code;

use super::{Cast, keyed, refusal, reserve_seat, secured_shop};
use crate::common::{settings, spawn_app, state_of};

#[sqlx::test(migrations = false)]
async fn a_participant_takes_tries_only_from_the_coordinator_and_resizes_only_for_an_admin(
    pool: PgPool,
) {
    let cast = Cast::new();
    let (app, seats) = secured_shop(pool.clone(), &cast).await;
    let try_a1 = proto::TryRequest {
        reservation_id: uuid::Uuid::now_v7().to_string(),
        branch_id: uuid::Uuid::new_v4().to_string(),
        holder: "mallory".into(),
        items: vec![crate::common::hold("seats", "A1")],
        expires_at: Some(prost_types::Timestamp {
            seconds: chrono::Utc::now().timestamp() + 600,
            nanos: 0,
        }),
    };
    let mut participant = ParticipantClient::connect(seats.clone()).await.unwrap();
    for key in [&cast.shop.key, &cast.stranger.key] {
        let denied = participant
            .r#try(keyed(try_a1.clone(), key))
            .await
            .unwrap_err();
        assert_eq!(
            refusal(&denied),
            (Code::PermissionDenied, "PERMISSION_DENIED".to_owned())
        );
    }
    let anonymous = participant
        .r#try(tonic::Request::new(try_a1.clone()))
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated);
    // Resizing is for admins; a client may read.
    let mut admin = crate::common::admin(&seats).await;
    let resize = crate::common::put_resources_request(&[("A1", 500)]);
    let denied = admin
        .put_resources(keyed(resize.clone(), &cast.shop.key))
        .await
        .unwrap_err();
    assert_eq!(
        refusal(&denied),
        (Code::PermissionDenied, "PERMISSION_DENIED".to_owned())
    );
    let read = admin
        .get_resource(keyed(
            proto::GetResourceRequest {
                resource: "A1".into(),
            },
            &cast.shop.key,
        ))
        .await
        .unwrap()
        .into_inner();
    // Nothing changed: capacity as the admin set it, nothing held.
    assert_eq!((read.capacity, read.held), (1, 0));

    // The coordinator's own key is what the participant accepts.
    let mut c = app.client.clone();
    let r = c
        .reserve(keyed(reserve_seat("o-1", "alice", "A1"), &cast.shop.key))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&r), proto::reservation::State::Held);

    // A coordinator without it cannot hold anything there.
    let mut keyless = settings(&[("seats", &seats)]);
    keyless.access.auth = cast.file.authenticator();
    let other = spawn_app(pool, keyless).await;
    let refused = other
        .client
        .clone()
        .reserve(keyed(reserve_seat("o-2", "bob", "A2"), &cast.shop.key))
        .await
        .unwrap_err();
    assert_ne!(refused.code(), Code::Ok);
    let a2 = admin
        .get_resource(keyed(
            proto::GetResourceRequest {
                resource: "A2".into(),
            },
            &cast.admin.key,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a2.held, 0, "a refused Try holds nothing");
}
