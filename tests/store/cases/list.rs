//! Listing reservations: newest first, keyset paging without gaps or repeats, and the holder
//! and state filters.

use std::collections::HashSet;

use holdfast::domain::State;

use super::{LONG, S, create, held, query};

pub async fn list_pages_and_filters(store: S) {
    let mut all = HashSet::new();
    for i in 0..5 {
        let (r, _) = if i < 2 {
            held(&store, "alice", &format!("a{i}"), LONG).await
        } else {
            create(&store, "alice", &format!("a{i}"), LONG).await
        };
        all.insert(r.id);
    }
    for i in 0..2 {
        all.insert(create(&store, "bob", &format!("b{i}"), LONG).await.0.id);
    }
    let everything = store.list(&query(None, None, 100)).await.unwrap();
    assert_eq!(everything.len(), 7);
    // Newest first, by (created_at, id).
    for w in everything.windows(2) {
        assert!((w[0].created_at, w[0].id) > (w[1].created_at, w[1].id));
    }
    // Keyset paging walks the same order without gaps or repeats.
    let mut paged = Vec::new();
    let mut q = query(None, None, 3);
    loop {
        let page = store.list(&q).await.unwrap();
        assert!(page.len() <= 3);
        let Some(last) = page.last() else { break };
        q.after = Some((last.created_at, last.id));
        paged.extend(page.iter().map(|r| r.id));
    }
    assert_eq!(paged, everything.iter().map(|r| r.id).collect::<Vec<_>>());
    assert_eq!(paged.iter().copied().collect::<HashSet<_>>(), all);
    // Branches come with each listed reservation.
    assert!(everything.iter().all(|r| r.branches.len() == 3));
    let alice = store.list(&query(Some("alice"), None, 100)).await.unwrap();
    assert_eq!(alice.len(), 5);
    assert!(alice.iter().all(|r| r.holder == "alice"));
    let held_now = store
        .list(&query(None, Some(State::Held), 100))
        .await
        .unwrap();
    assert_eq!(held_now.len(), 2);
    let trying_bob = store
        .list(&query(Some("bob"), Some(State::Trying), 100))
        .await
        .unwrap();
    assert_eq!(trying_bob.len(), 2);
    assert!(
        store
            .list(&query(Some("nobody"), None, 100))
            .await
            .unwrap()
            .is_empty()
    );
}

/// Every List shape (owner, holder, state; with lazy expiry: a lapsed HELD lists as EXPIRED,
/// not HELD) answers exactly what filtering a full read would, in order, page by page.
pub async fn every_shape_answers_as_a_full_read_filtered(store: S) {
    use holdfast::domain::{BranchState, ListQuery};

    use super::{SHORT, cancel, confirm, decide, lapse, new_res, reports};
    let mut made = Vec::new();
    for (i, (owner, holder)) in [
        ("alice", "h1"),
        ("alice", "h2"),
        ("bob", "h1"),
        ("alice", "h1"),
        ("bob", "h2"),
        ("", "h1"),
    ]
    .into_iter()
    .cycle()
    .take(18)
    .enumerate()
    {
        let mut new = new_res(
            holder,
            &format!("r{i}"),
            if i % 3 == 0 { SHORT } else { LONG },
        );
        new.owner = owner.to_owned();
        let r = match store
            .create(&new, super::lease(), super::NO_LIMITS)
            .await
            .unwrap()
        {
            holdfast::store::Created::New(r) => r,
            other => panic!("expected a new reservation, got {other:?}"),
        };
        let token = super::token_of(r.id);
        // Stay TRYING, or be HELD (and then maybe confirmed or cancelled).
        if i % 5 != 4 {
            store
                .record_held(r.id, &reports(&r, BranchState::Held, None))
                .await
                .unwrap();
            match i % 6 {
                1 => drop(decide(&store, r.id, &token, &confirm()).await),
                2 => drop(decide(&store, r.id, &token, &cancel()).await),
                _ => {}
            }
        }
        made.push(r.id);
    }
    // The short holds still HELD lapse: they read EXPIRED without any write.
    lapse().await;
    let everything = store.list(&query(None, None, 1000)).await.unwrap();
    assert_eq!(everything.len(), made.len());
    assert!(
        everything
            .iter()
            .any(|r| r.state == State::Expired && r.stored_state == State::Held)
    );
    assert!(everything.iter().any(|r| r.state == State::Held));
    let states = [
        None,
        Some(State::Held),
        Some(State::Expired),
        Some(State::Trying),
        Some(State::Confirming),
        Some(State::Cancelling),
        Some(State::Confirmed),
    ];
    for owner in [None, Some("alice"), Some("bob"), Some("")] {
        for holder in [None, Some("h1"), Some("h2")] {
            for state in states {
                let expected: Vec<_> = everything
                    .iter()
                    .filter(|r| owner.is_none_or(|o| r.owner == o))
                    .filter(|r| holder.is_none_or(|h| r.holder == h))
                    .filter(|r| state.is_none_or(|s| r.state == s))
                    .map(|r| (r.id, r.state))
                    .collect();
                let mut q = ListQuery {
                    owner: owner.map(str::to_owned),
                    holder: holder.map(str::to_owned),
                    state,
                    limit: 2,
                    after: None,
                    ..Default::default()
                };
                let mut paged = Vec::new();
                loop {
                    let page = store.list(&q).await.unwrap();
                    assert!(page.len() <= 2);
                    let Some(last) = page.last() else { break };
                    q.after = Some((last.created_at, last.id));
                    paged.extend(page.iter().map(|r| (r.id, r.state)));
                }
                assert_eq!(
                    paged, expected,
                    "owner {owner:?}, holder {holder:?}, state {state:?}"
                );
            }
        }
    }
}
