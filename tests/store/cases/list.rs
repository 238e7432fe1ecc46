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
