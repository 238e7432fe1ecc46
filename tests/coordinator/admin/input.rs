//! Who may call `tcc.v1.Admin` (admins only) and how bad input is refused: the error names
//! the field or the state, and nothing changes (state, participants, audit log).

use holdfast::proto;
use holdfast::proto::reservation::State;
use holdfast::proto::retry_request::Target;
use sqlx::PgPool;
use tonic::Code;

use super::{ops, state};
use crate::auth::{keyed, refusal};
use crate::common::{error_metadata, reason};

#[sqlx::test(migrations = false)]
async fn only_admins_reach_the_admin_service(pool: PgPool) {
    let mut ops = ops(pool).await;
    let r = ops.held("auth-1").await;
    let key = ops.cast.shop.key.clone();
    let denied = (Code::PermissionDenied, "PERMISSION_DENIED".to_owned());
    let a = &mut ops.admin;
    let id = r.id.clone();
    assert_eq!(
        refusal(
            &a.list_stuck(keyed(proto::ListStuckRequest::default(), &key))
                .await
                .unwrap_err()
        ),
        denied
    );
    assert_eq!(
        refusal(
            &a.retry(keyed(
                proto::RetryRequest {
                    target: Some(Target::ReservationId(id.clone())),
                    ..Default::default()
                },
                &key
            ))
            .await
            .unwrap_err()
        ),
        denied
    );
    assert_eq!(
        refusal(
            &a.force_cancel(keyed(
                proto::ForceCancelRequest {
                    reservation_id: id.clone(),
                    reason: "mine".into()
                },
                &key
            ))
            .await
            .unwrap_err()
        ),
        denied
    );
    assert_eq!(
        refusal(
            &a.resolve(keyed(
                proto::ResolveRequest {
                    reservation_id: id.clone(),
                    outcome: State::Cancelled.into(),
                    reason: "mine".into()
                },
                &key
            ))
            .await
            .unwrap_err()
        ),
        denied
    );
    assert_eq!(
        refusal(
            &a.list_audit(keyed(proto::ListAuditRequest::default(), &key))
                .await
                .unwrap_err()
        ),
        denied
    );
    // No key at all: not authenticated.
    let anonymous = a
        .list_audit(proto::ListAuditRequest::default())
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated);
    // Nothing happened; the admin's key works.
    assert_eq!(state(&ops.get(&r.id).await), State::Held);
    assert_eq!(ops.audit_len().await, 0);
    let listed = ops
        .admin
        .list_audit(ops.as_admin(proto::ListAuditRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert!(listed.entries.is_empty());
}

#[sqlx::test(migrations = false)]
async fn bad_input_names_the_field_and_changes_nothing(pool: PgPool) {
    let mut ops = ops(pool).await;
    let r = ops.held("bad-1").await;
    let field = |s: &tonic::Status| (s.code(), reason(s), error_metadata(s)["field"].clone());
    let invalid = |f: &str| {
        (
            Code::InvalidArgument,
            "INVALID_ARGUMENT".to_owned(),
            f.to_owned(),
        )
    };

    let fc = |id: &str, why: &str| proto::ForceCancelRequest {
        reservation_id: id.into(),
        reason: why.into(),
    };
    for (req, f) in [
        (fc(&r.id, ""), "reason"),
        (fc(&r.id, &"x".repeat(257)), "reason"),
        (fc("not-a-uuid", "why"), "reservation_id"),
        (fc("", "why"), "reservation_id"),
    ] {
        let e = ops.admin.force_cancel(ops.as_admin(req)).await.unwrap_err();
        assert_eq!(field(&e), invalid(f), "{e:?}");
    }
    let rs = |id: &str, outcome: State, why: &str| proto::ResolveRequest {
        reservation_id: id.into(),
        outcome: outcome.into(),
        reason: why.into(),
    };
    for (req, f) in [
        (rs(&r.id, State::Cancelled, ""), "reason"),
        (rs(&r.id, State::Held, "why"), "outcome"),
        (rs(&r.id, State::Unspecified, "why"), "outcome"),
        (rs("nope", State::Cancelled, "why"), "reservation_id"),
    ] {
        let e = ops.admin.resolve(ops.as_admin(req)).await.unwrap_err();
        assert_eq!(field(&e), invalid(f), "{e:?}");
    }
    let e = ops
        .admin
        .retry(ops.as_admin(proto::RetryRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(field(&e), invalid("target"));
    // A reason, when given, is held to the rules of every admin reason.
    let e = ops
        .admin
        .retry(ops.as_admin(proto::RetryRequest {
            target: Some(Target::Participant("stock".into())),
            reason: "x".repeat(257),
        }))
        .await
        .unwrap_err();
    assert_eq!(field(&e), invalid("reason"));
    let e = ops
        .admin
        .retry(ops.as_admin(proto::RetryRequest {
            target: Some(Target::Participant("nobody".into())),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "UNKNOWN_PARTICIPANT");
    let e = ops
        .admin
        .list_stuck(ops.as_admin(proto::ListStuckRequest {
            states: vec![State::Held.into(), State::Cancelled.into()],
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(field(&e), invalid("states[1]"));
    let e = ops
        .admin
        .list_audit(ops.as_admin(proto::ListAuditRequest {
            page_token: "garbage".into(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(field(&e), invalid("page_token"));

    // Wrong state: Resolve of a HELD reservation; unknown reservation.
    let e = ops
        .admin
        .resolve(ops.as_admin(rs(&r.id, State::Cancelled, "why")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(reason(&e), "RESERVATION_NOT_FAILED");
    assert_eq!(error_metadata(&e)["state"], "HELD");
    let e = ops
        .admin
        .force_cancel(ops.as_admin(fc(&uuid::Uuid::new_v4().to_string(), "why")))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "RESERVATION_NOT_FOUND");

    // Nothing changed anywhere.
    assert_eq!(state(&ops.get(&r.id).await), State::Held);
    assert_eq!(ops.fakes.get("seats").held(), vec!["A1"]);
    assert_eq!(ops.fakes.log.count("seats", "Cancel"), 0);
    assert_eq!(ops.audit_len().await, 0);
}
