//! CHECK constraints and trigger conditions that PostgreSQL would fold again in every statement
//! writing their table (`#[path]`-included by the test binaries that check a schema): each one
//! whose stored expression holds an `ARRAY[...]` of separate values (write them as
//! `col = ANY ('{A,B}'::text[])`: migrations `0017`, `0091`, `0068`).

use sqlx::PgPool;

/// Fails naming every such expression in `pool`'s database.
pub async fn assert_none_folded(pool: &PgPool) {
    let folded = folded_per_statement(pool).await;
    assert!(
        folded.is_empty(),
        "write these as `col = ANY ('{{..}}'::text[])`: {folded:?}"
    );
}

/// `table: constraint name` / `table: trigger name` of every such expression in `pool`'s
/// database, sorted.
async fn folded_per_statement(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT format('%s: constraint %s', conrelid::regclass, conname) FROM pg_constraint \
         WHERE contype = 'c' AND conrelid <> 0 AND conbin::text LIKE '%{ARRAYEXPR %' \
         UNION ALL \
         SELECT format('%s: trigger %s', tgrelid::regclass, tgname) FROM pg_trigger \
         WHERE NOT tgisinternal AND tgqual::text LIKE '%{ARRAYEXPR %' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .expect("reading the catalog")
}

/// The SQLSTATE and constraint name of `sql`'s failure (a CHECK refusing it: `23514`).
pub async fn refusal(pool: &PgPool, sql: &'static str) -> (String, String) {
    let error = sqlx::query(sql)
        .execute(pool)
        .await
        .expect_err("the statement is refused");
    let db = error.as_database_error().expect("a database error");
    (
        db.code().expect("a SQLSTATE").into_owned(),
        db.constraint().expect("the constraint's name").to_owned(),
    )
}
