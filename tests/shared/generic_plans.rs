//! The plans PostgreSQL would use for statements a session prepared, once it settles on a
//! generic plan (`#[path]`-included by the test binaries that check plans): the statements
//! under test run on a pool of one connection, then the test reads that session's
//! `pg_prepared_statements` and explains each under `plan_cache_mode = force_generic_plan`.

use sqlx::{AssertSqlSafe, PgConnection};

/// A prepared statement and its generic plan.
pub struct Prepared {
    pub statement: String,
    pub plan: String,
}

impl Prepared {
    /// The indexes the plan walks whose names start with `prefix`: "... Scan using <index> on
    /// ..." (index and index-only scans) and "Bitmap Index Scan on <index>".
    pub fn indexes(&self, prefix: &str) -> Vec<&str> {
        [" using ", "Bitmap Index Scan on "]
            .into_iter()
            .flat_map(|marker| self.plan.split(marker).skip(1))
            .filter_map(|rest| rest.split_whitespace().next())
            .filter(|index| index.starts_with(prefix))
            .collect()
    }
}

/// Every statement this session prepared that is `LIKE` each of `patterns`, with its generic
/// plan. Leaves the session planning generically.
pub async fn prepared(conn: &mut PgConnection, patterns: &[&str]) -> Vec<Prepared> {
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    let filter = patterns
        .iter()
        .enumerate()
        .map(|(i, _)| format!("statement LIKE ${}", i + 1))
        .collect::<Vec<_>>()
        .join(" AND ");
    let mut query = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT name, cardinality(parameter_types), statement FROM pg_prepared_statements \
         WHERE {filter}"
    )));
    for pattern in patterns {
        query = query.bind(*pattern);
    }
    let statements: Vec<(String, i32, String)> = query.fetch_all(&mut *conn).await.unwrap();
    let mut explained = Vec::new();
    for (name, parameters, statement) in statements {
        // A generic plan does not depend on the values: NULL for each.
        let nulls = vec!["NULL"; usize::try_from(parameters).unwrap()].join(", ");
        let arguments = if nulls.is_empty() {
            String::new()
        } else {
            format!("({nulls})")
        };
        let plan: Vec<String> =
            sqlx::query_scalar(AssertSqlSafe(format!("EXPLAIN EXECUTE {name}{arguments}")))
                .fetch_all(&mut *conn)
                .await
                .unwrap();
        explained.push(Prepared {
            statement,
            plan: plan.join("\n"),
        });
    }
    explained
}

/// A bitmap scan names its index without "using": it counts too (it was missed before, so a
/// barrier statement walking the orphans index by bitmap would have passed).
#[test]
fn an_index_walked_by_a_bitmap_scan_is_named() {
    let prepared = Prepared {
        statement: String::new(),
        plan: "Update on tcc_barrier b\n  ->  Bitmap Heap Scan on tcc_barrier b\n        ->  Bitmap Index Scan on tcc_barrier_orphans\n  ->  Index Only Scan using tcc_barrier_pkey on tcc_barrier".into(),
    };
    let mut found = prepared.indexes("tcc_barrier_");
    found.sort_unstable();
    assert_eq!(found, ["tcc_barrier_orphans", "tcc_barrier_pkey"]);
}
