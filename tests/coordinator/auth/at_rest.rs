//! No hold token at rest (SPEC 7.3): after a run of Reserves, repeats, Confirms and Cancels no
//! column of any table holds a token the API answered (the coordinator's and the
//! participants' tables alike); tokens an earlier version stored in plaintext become digests
//! when the schema is migrated, on PostgreSQL and SQLite, and keep working; replicas that
//! share the token key answer a repeated Reserve with the same token.

use holdfast::domain::{Decision, TokenKeys};
use holdfast::participants::Kind;
use holdfast::proto::reservation::State;
use holdfast::store::{Decided, Store};
use sqlx::PgPool;

use crate::common::{
    Decide, hold, reserve_request, settings, spawn_app, spawn_participant, state_of,
};

/// Every (table, column) of the database's public schema: tables only, for a view stores
/// nothing (and an extension's view, such as `pg_stat_statements` created in `template1`
/// without its library loaded, fails when read).
async fn columns(pool: &PgPool) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT c.table_name::text, c.column_name::text FROM information_schema.columns c \
         JOIN information_schema.tables t \
           ON t.table_schema = c.table_schema AND t.table_name = c.table_name \
         WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE' ORDER BY 1, 2",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The (table, column)s whose text form contains `needle`, as text or as bytes.
async fn holding(pool: &PgPool, needle: &str) -> Vec<(String, String)> {
    let as_bytes_hex: String = needle.bytes().map(|b| format!("{b:02x}")).collect();
    let mut found = Vec::new();
    for (table, column) in columns(pool).await {
        let sql = format!(
            "SELECT count(*) FROM \"{table}\" WHERE position($1 in \"{column}\"::text) > 0 \
                OR position($2 in \"{column}\"::text) > 0"
        );
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(needle)
            .bind(&as_bytes_hex)
            .fetch_one(pool)
            .await
            .unwrap();
        if n > 0 {
            found.push((table, column));
        }
    }
    found
}

#[sqlx::test(migrations = false)]
async fn no_table_holds_a_hold_token(pool: PgPool) {
    let seats = spawn_participant(Kind::Seats, &pool).await;
    crate::common::put_resources(&seats, &[("A1", 1), ("A2", 1), ("A3", 1)]).await;
    let app = spawn_app(pool.clone(), settings(&[("seats", &seats)])).await;
    let mut c = app.client.clone();
    let mut tokens = Vec::new();
    for (i, seat) in ["A1", "A2", "A3"].iter().enumerate() {
        let req = reserve_request(&format!("o-{i}"), vec![hold("seats", seat)]);
        let r = c.reserve(req.clone()).await.unwrap().into_inner();
        let repeat = c.reserve(req).await.unwrap().into_inner();
        assert_eq!(
            repeat.hold_token, r.hold_token,
            "a repeat answers the same token"
        );
        match i {
            0 => drop(c.confirm(Decide::on(&r).confirm()).await.unwrap()),
            1 => drop(c.cancel(Decide::on(&r).cancel()).await.unwrap()),
            _ => drop(c.extend(Decide::on(&r).extend(None, "")).await.unwrap()),
        }
        tokens.push(r.hold_token);
    }
    assert!(
        columns(&pool).await.len() > 20,
        "the scan covers the schema"
    );
    for token in &tokens {
        assert_eq!(holding(&pool, token).await, Vec::<(String, String)>::new());
    }
    // The scan does find what is there (a check of the check).
    assert!(!holding(&pool, "o-1").await.is_empty());
}

/// A HELD reservation as an earlier version stored it: its token in plaintext.
const LEGACY_TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

#[sqlx::test(migrations = false)]
async fn plaintext_tokens_of_an_earlier_version_become_digests_and_still_work(pool: PgPool) {
    holdfast::store::postgres::MIGRATOR
        .run_to(2, &pool)
        .await
        .unwrap();
    let id = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO reservations (id, request_id, holder, state, hold_token, ttl_ms, expires_at) \
         VALUES ($1, 'legacy-1', 'alice', 'HELD', $2, 600000, now() + interval '10 minutes')",
    )
    .bind(id)
    .bind(LEGACY_TOKEN)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO branches (reservation_id, position, branch_id, participant, resource, \
                               quantity, state) VALUES ($1, 0, $2, 'noop', 'x', 1, 'HELD')",
    )
    .bind(id)
    .bind(uuid::Uuid::new_v4())
    .execute(&pool)
    .await
    .unwrap();
    // The participants' schema first: the participant migrates in a task of its own, and a
    // migration dropping a column while `holding` reads every column would fail the scan.
    holdfast::participants::MIGRATOR.run(&pool).await.unwrap();
    let noop = spawn_participant(Kind::Noop, &pool).await;
    // The coordinator migrates its schema as it starts.
    let app = spawn_app(pool.clone(), settings(&[("noop", &noop)])).await;
    assert!(
        holding(&pool, LEGACY_TOKEN).await.is_empty(),
        "the plaintext token is gone"
    );
    let mut c = app.client.clone();
    let wrong = c
        .cancel(Decide::with_token(&id.to_string(), "not-it").cancel())
        .await
        .unwrap_err();
    assert_eq!(crate::common::reason(&wrong), "HOLD_TOKEN_MISMATCH");
    let cancelled = c
        .cancel(Decide::with_token(&id.to_string(), LEGACY_TOKEN).cancel())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&cancelled), State::Cancelled);
}

#[tokio::test]
async fn sqlite_plaintext_tokens_of_an_earlier_version_become_digests_and_still_work() {
    let dir = std::env::temp_dir().join(format!("holdfast-legacy-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("coordinator.db").display());
    let store = holdfast::store::SqliteStore::connect(&url, 2)
        .await
        .unwrap();
    let pool = holdfast::db::open_sqlite(&url, 1).await.unwrap();
    holdfast::store::sqlite::MIGRATOR
        .run_to(2, &pool)
        .await
        .unwrap();
    let id = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO reservations (id, request_id, holder, state, hold_token, ttl_ms, expires_at) \
         VALUES (?1, 'legacy-1', 'alice', 'HELD', ?2, 600000, \
                 CAST(unixepoch('subsec') * 1000000 AS INTEGER) + 600000000)",
    )
    .bind(id)
    .bind(LEGACY_TOKEN)
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    store.migrate().await.unwrap();
    let cancel = Decision::Cancel { reason: None };
    let lease = holdfast::store::WorkLease {
        owner: uuid::Uuid::new_v4(),
        duration: std::time::Duration::from_secs(30),
    };
    assert!(matches!(
        store
            .decide(id, None, &presented("not-it"), &cancel, lease)
            .await
            .unwrap(),
        Decided::TokenMismatch
    ));
    assert!(matches!(
        store
            .decide(id, None, &presented(LEGACY_TOKEN), &cancel, lease)
            .await
            .unwrap(),
        Decided::Judged { .. }
    ));
    drop(store);
    for entry in std::fs::read_dir(&dir).unwrap() {
        // The writer thread closes its connection once the store is dropped, on its own
        // time; SQLite then removes the -wal and -shm files. One gone holds nothing.
        let bytes = match std::fs::read(entry.unwrap().path()) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            read => read.unwrap(),
        };
        assert!(
            !bytes
                .windows(LEGACY_TOKEN.len())
                .any(|w| w == LEGACY_TOKEN.as_bytes())
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[sqlx::test(migrations = false)]
async fn replicas_sharing_the_token_key_answer_a_repeat_with_the_same_token(pool: PgPool) {
    let noop = spawn_participant(Kind::Noop, &pool).await;
    let text = holdfast::auth::keys::token_secret("k1").unwrap();
    let shared: TokenKeys = holdfast::config::auth::parse_token_keys(&text).unwrap();
    let replica = |tokens: Option<TokenKeys>| {
        let mut s = settings(&[("noop", &noop)]);
        s.access.tokens = tokens;
        spawn_app(pool.clone(), s)
    };
    let (a, b) = (
        replica(Some(shared.clone())).await,
        replica(Some(shared)).await,
    );
    let other = replica(None).await;
    let req = reserve_request("o-1", vec![hold("noop", "x")]);
    let first = a
        .client
        .clone()
        .reserve(req.clone())
        .await
        .unwrap()
        .into_inner();
    let at_b = b
        .client
        .clone()
        .reserve(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (at_b.id.as_str(), at_b.hold_token.as_str()),
        (first.id.as_str(), first.hold_token.as_str())
    );
    // A replica without the key answers the reservation but cannot make up its token.
    let at_other = other
        .client
        .clone()
        .reserve(req)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(at_other.id, first.id);
    assert!(at_other.hold_token.is_empty());
}

/// A hold token as a caller presents it.
fn presented(token: &str) -> holdfast::domain::PresentedToken {
    holdfast::domain::PresentedToken::parse(token).expect("a well-formed token")
}
