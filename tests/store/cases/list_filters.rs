//! ListReservations' further filters on both databases: a participant, a creation time range,
//! labels (every one given, with its value); with the owner/holder/state filters and paging.

use holdfast::domain::{ListQuery, Reservation};

use super::*;

/// A reservation of `holder` at `participant` with `labels`.
async fn made(
    store: &S,
    request_id: &str,
    participant: &str,
    labels: &[(&str, &str)],
) -> Reservation {
    let mut new = new_res("alice", request_id, LONG);
    new.holds.retain(|h| h.participant == "seats");
    for h in &mut new.holds {
        h.participant = participant.to_owned();
    }
    new.labels = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    match store.create(&new, lease(), NO_LIMITS).await.unwrap() {
        Created::New(r) => r,
        other => panic!("{other:?}"),
    }
}

fn ids(rs: &[Reservation]) -> Vec<&str> {
    rs.iter().map(|r| r.request_id.as_str()).collect()
}

pub async fn participant_time_and_labels(store: S) {
    let a = made(&store, "a", "seats", &[("shop", "eu"), ("tier", "gold")]).await;
    let b = made(&store, "b", "stock", &[("shop", "eu")]).await;
    let c = made(&store, "c", "seats", &[("shop", "us"), ("tier", "gold")]).await;
    let q = |f: &dyn Fn(&mut ListQuery)| {
        let mut q = query(None, None, 10);
        f(&mut q);
        q
    };
    let list = |q: ListQuery| {
        let store = store.clone();
        async move { store.list(&q).await.unwrap() }
    };

    let at_seats = list(q(&|q| q.participant = Some("seats".into()))).await;
    assert_eq!(ids(&at_seats), vec!["c", "a"]);
    let nowhere = list(q(&|q| q.participant = Some("rooms".into()))).await;
    assert!(nowhere.is_empty());

    let eu = list(q(&|q| {
        q.labels.insert("shop".into(), "eu".into());
    }))
    .await;
    assert_eq!(ids(&eu), vec!["b", "a"]);
    let eu_gold = list(q(&|q| {
        q.labels.insert("shop".into(), "eu".into());
        q.labels.insert("tier".into(), "gold".into());
    }))
    .await;
    assert_eq!(ids(&eu_gold), vec!["a"]);
    let gold_at_seats_held = list(q(&|q| {
        q.labels.insert("tier".into(), "gold".into());
        q.participant = Some("seats".into());
        q.state = Some(State::Trying);
        q.holder = Some("alice".into());
    }))
    .await;
    assert_eq!(ids(&gold_at_seats_held), vec!["c", "a"]);
    let wrong_value = list(q(&|q| {
        q.labels.insert("tier".into(), "silver".into());
    }))
    .await;
    assert!(wrong_value.is_empty());

    // Time range: [after, before), by the stored creation times.
    let from_b = list(q(&|q| q.created_after = Some(b.created_at))).await;
    assert_eq!(ids(&from_b), vec!["c", "b"]);
    let before_b = list(q(&|q| q.created_before = Some(b.created_at))).await;
    assert_eq!(ids(&before_b), vec!["a"]);
    let just_b = list(q(&|q| {
        q.created_after = Some(b.created_at);
        q.created_before = Some(c.created_at);
    }))
    .await;
    assert_eq!(ids(&just_b), vec!["b"]);
    assert!(a.created_at < b.created_at && b.created_at < c.created_at);

    // Paging with a filter: one at a time, the cursor after the last.
    let mut paged = Vec::new();
    let mut page_q = q(&|q| {
        q.participant = Some("seats".into());
        q.limit = 1;
    });
    loop {
        let page = list(page_q.clone()).await;
        let Some(last) = page.last() else { break };
        paged.push(last.request_id.clone());
        page_q.after = Some((last.created_at, last.id));
    }
    assert_eq!(paged, vec!["c", "a"]);
}
