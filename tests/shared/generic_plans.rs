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
    /// The indexes the plan walks whose names start with `prefix` ("... using <index> on ...").
    pub fn indexes(&self, prefix: &str) -> Vec<&str> {
        self.plan
            .split(" using ")
            .skip(1)
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
