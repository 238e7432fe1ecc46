//! List's lookups (the console's search, `holdfast get PREFIX`): ids by prefix, in id order and
//! paged; reservations by request id, any holder; both scoped to an owner. And the counts by
//! state the console's overview reads (Admin `CountReservations`), and where stuck work stands
//! (its next retry, `ListStuck`'s `work`).

use holdfast::domain::{Find, ListQuery, State};

use super::{LONG, S, SHORT, SLOW, cancel, create, decide, held, lapse, reports};

fn by_prefix(prefix: &str, limit: u32) -> ListQuery {
    ListQuery {
        limit,
        find: Some(Find::id_prefix("id_prefix", prefix).unwrap()),
        ..Default::default()
    }
}

pub async fn id_prefix_finds_its_range_in_id_order(store: S) {
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(create(&store, &format!("h{i}"), "same", LONG).await.0.id);
    }
    ids.sort();
    // A whole id finds itself alone, with or without dashes.
    for whole in [
        ids[2].to_string(),
        ids[2].simple().to_string().to_uppercase(),
    ] {
        let found = store.list(&by_prefix(&whole, 10)).await.unwrap();
        assert_eq!(found.iter().map(|r| r.id).collect::<Vec<_>>(), [ids[2]]);
        assert_eq!(found[0].branches.len(), 3, "with its branches");
    }
    // The common first digits find every one, in id order, page after page.
    let common = common_prefix(&ids);
    assert!(
        common.len() >= 4,
        "ids made together share their time prefix"
    );
    let mut q = by_prefix(&common, 2);
    let mut paged = Vec::new();
    loop {
        let page = store.list(&q).await.unwrap();
        assert!(page.len() <= 2);
        let Some(last) = page.last() else { break };
        q.after = Some((last.created_at, last.id));
        paged.extend(page.iter().map(|r| r.id));
    }
    assert_eq!(paged, ids);
    // Ids starting otherwise are not found; nor another owner's.
    let other = if common.starts_with('f') {
        "0000"
    } else {
        "ffff"
    };
    assert!(store.list(&by_prefix(other, 10)).await.unwrap().is_empty());
    let mut theirs = by_prefix(&common, 10);
    theirs.owner = Some("someone-else".into());
    assert!(store.list(&theirs).await.unwrap().is_empty());
}

/// The hex digits every id starts with.
fn common_prefix(ids: &[uuid::Uuid]) -> String {
    let hex: Vec<String> = ids.iter().map(|i| i.simple().to_string()).collect();
    let n = (0..32)
        .take_while(|&k| hex.iter().all(|h| h.as_bytes()[k] == hex[0].as_bytes()[k]))
        .count();
    hex[0][..n].to_owned()
}

pub async fn request_id_finds_every_holders_newest_first(store: S) {
    let a = create(&store, "alice", "order-17", LONG).await.0;
    let b = create(&store, "bob", "order-17", LONG).await.0;
    create(&store, "carol", "order-18", LONG).await;
    // A LIKE wildcard is a character like any other here.
    create(&store, "dave", "order-1%", LONG).await;
    let q = |request_id: &str| ListQuery {
        limit: 10,
        find: Some(Find::RequestId(request_id.into())),
        ..Default::default()
    };
    let found = store.list(&q("order-17")).await.unwrap();
    assert_eq!(found.iter().map(|r| r.id).collect::<Vec<_>>(), [b.id, a.id]);
    assert_eq!(store.list(&q("order-1%")).await.unwrap().len(), 1);
    assert!(store.list(&q("order-1_")).await.unwrap().is_empty());
    let mut first = q("order-17");
    first.limit = 1;
    let page = store.list(&first).await.unwrap();
    assert_eq!(page[0].id, b.id);
    first.after = Some((page[0].created_at, page[0].id));
    assert_eq!(store.list(&first).await.unwrap()[0].id, a.id);
    let mut theirs = q("order-17");
    theirs.owner = Some("someone-else".into());
    assert!(store.list(&theirs).await.unwrap().is_empty());
}

pub async fn counts_by_state_come_from_the_database(store: S) {
    let empty = store.count_by_state().await.unwrap();
    assert!(
        empty.live.is_empty() && empty.minutes.is_empty(),
        "{empty:?}"
    );
    create(&store, "a", "r1", LONG).await;
    create(&store, "b", "r2", LONG).await;
    held(&store, "c", "r3", LONG).await;
    held(&store, "d", "r4", SHORT).await;
    lapse().await;
    let counts = store.count_by_state().await.unwrap();
    let mut live = counts.live.clone();
    live.sort_by_key(|(s, _)| s.as_str());
    assert_eq!(
        live,
        [(State::Expired, 1), (State::Held, 1), (State::Trying, 2)],
        "a lapsed hold reads EXPIRED"
    );
    let in_hour = |state: State| -> i64 {
        counts
            .minutes
            .iter()
            .filter(|(_, s, _)| *s == state)
            .map(|(_, _, n)| n)
            .sum()
    };
    assert_eq!(
        (
            in_hour(State::Trying),
            in_hour(State::Held),
            in_hour(State::Expired)
        ),
        (2, 1, 1)
    );
    for (minute, _, _) in &counts.minutes {
        assert!(*minute <= counts.at, "{minute} after {}", counts.at);
        assert!(counts.at - *minute < chrono::Duration::minutes(61));
        assert_eq!(minute.timestamp() % 60, 0, "a minute's first instant");
    }
}

pub async fn work_of_reads_when_each_is_driven_next(store: S) {
    let (r, token) = held(&store, "alice", "w-1", LONG).await;
    decide(&store, r.id, &token, &cancel()).await;
    // A release that failed at a participant: retried after the (slow) backoff.
    let failed = reports(
        &r,
        holdfast::domain::BranchState::Held,
        Some("seats unavailable"),
    );
    store
        .record_phase(r.id, State::Cancelling, &failed, None, SLOW)
        .await
        .unwrap();
    let missing = uuid::Uuid::now_v7();
    let work = store.work_of(&[r.id, missing]).await.unwrap();
    assert_eq!(work.len(), 1, "{work:?}");
    assert_eq!(work[0].reservation_id, r.id);
    let next = work[0].next_attempt_at.expect("a retry is scheduled");
    let now = chrono::Utc::now();
    assert!(
        next > now + chrono::Duration::minutes(20) && next < now + chrono::Duration::hours(2),
        "{next} against {now}"
    );
    assert!(work[0].attempts >= 1, "{work:?}");
    assert!(store.work_of(&[]).await.unwrap().is_empty());
}
