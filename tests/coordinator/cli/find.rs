//! `holdfast get PREFIX` and `holdfast watch PREFIX`: the first characters of an id find its one
//! match; several matches list the candidates (exit 4, `AMBIGUOUS_ID`); none is
//! `RESERVATION_NOT_FOUND` (exit 1); a caller finds only what it may read.

use serde_json::Value;
use sqlx::PgPool;

use super::{json, run, stderr, stdout};
use crate::auth::{Cast, keyed, reserve_seat, secured_shop};

#[sqlx::test]
async fn get_finds_a_reservation_by_the_first_characters_of_its_id(pool: PgPool) {
    let cast = Cast::new();
    let (mut app, seats) = secured_shop(pool, &cast).await;
    crate::common::admin(&seats)
        .await
        .put_resources(keyed(
            crate::common::put_resources_request(&[("A3", 1)]),
            &cast.admin.key,
        ))
        .await
        .unwrap();
    let url = format!("http://{}", app.addr);
    let mut ids = Vec::new();
    for (i, seat) in ["A1", "A2", "A3"].into_iter().enumerate() {
        let request = reserve_seat(&format!("find-{i}"), "alice", seat);
        let r = app
            .client
            .reserve(keyed(request, &cast.shop.key))
            .await
            .unwrap();
        ids.push(r.into_inner().id);
    }
    let shop = ["--coordinator", &url, "--api-key", &cast.shop.key];

    // Enough of one id: that one, whole.
    let unique = &ids[1].replace('-', "")[..24];
    let o = run(&[&["get", unique][..], &shop].concat()).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("id          {}", ids[1])),
        "{}",
        stdout(&o)
    );
    let o = run(&[&["get", &ids[2][..28].to_uppercase(), "--json"][..], &shop].concat()).await;
    assert_eq!(json(&o)["id"], ids[2].as_str(), "either case, dashes kept");

    // What all three start with: the candidates, and exit 4.
    let common: String = ids[0]
        .chars()
        .zip(ids[1].chars())
        .zip(ids[2].chars())
        .take_while(|((a, b), c)| a == b && b == c)
        .map(|((a, _), _)| a)
        .collect();
    assert!(
        common.replace('-', "").len() >= 4,
        "ids made together share a prefix: {ids:?}"
    );
    let o = run(&[&["get", &common][..], &shop].concat()).await;
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(stderr(&o).contains("AMBIGUOUS_ID"), "{}", stderr(&o));
    for id in &ids {
        assert!(
            stdout(&o).contains(id.as_str()),
            "a candidate missing: {}",
            stdout(&o)
        );
    }
    let o = run(&[&["get", &common, "--json"][..], &shop].concat()).await;
    assert_eq!(o.status.code(), Some(4));
    assert_eq!(json(&o)["reservations"].as_array().map(Vec::len), Some(3));
    let e: Value = serde_json::from_slice(&o.stderr).unwrap();
    assert_eq!(
        (e["reason"].as_str(), e["metadata"]["id_prefix"].as_str()),
        (Some("AMBIGUOUS_ID"), Some(common.as_str()))
    );

    // No match: not found, exit 1; a stranger finds none of alice's; too short is refused.
    let none = if common.starts_with('f') {
        "0000"
    } else {
        "ffff"
    };
    let o = run(&[&["get", none][..], &shop].concat()).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("RESERVATION_NOT_FOUND"),
        "{}",
        stderr(&o)
    );
    let stranger = ["--coordinator", &url, "--api-key", &cast.stranger.key];
    let o = run(&[&["get", unique][..], &stranger].concat()).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let o = run(&[&["get", "01a", "--json"][..], &shop].concat()).await;
    assert_eq!(o.status.code(), Some(1));
    let e: Value = serde_json::from_slice(&o.stderr).unwrap();
    assert_eq!(
        (e["code"].as_str(), e["metadata"]["field"].as_str()),
        (Some("INVALID_ARGUMENT"), Some("id_prefix")),
        "{e}"
    );
    app.shut_down();
}
