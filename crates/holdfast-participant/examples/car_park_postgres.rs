//! A team's own participant on PostgreSQL, in under a page: car-park bays with a counter of
//! free spaces. Only the business SQL is written here; the barrier makes every call idempotent
//! and safe against disorder. Run: `DATABASE_URL=postgres://postgres@127.0.0.1/parking cargo
//! run -p holdfast-participant --example car_park_postgres`, then register
//! `car-park=http://127.0.0.1:50070` with the coordinator (`CAR_PARK_LISTEN` picks another
//! address; `CAR_PARK_AUTH_KEYS` a principals file, as `--auth-keys` of holdfast). Three
//! methods of `Resource` are all it writes; the optional `Shortcuts` (fewer round trips for a
//! hot call) are for later, when a benchmark shows one pays.

use holdfast_participant::{
    BranchCtx, ConfirmOutcome, ParticipantService, Resource, ResourceError, TryAnswer, auth, db,
    server,
};
use sqlx::PgConnection;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS bay (id text PRIMARY KEY, free bigint NOT NULL CHECK (free >= 0));
CREATE TABLE IF NOT EXISTS bay_hold (branch_id text, bay text, spaces bigint, state text,
                                     PRIMARY KEY (branch_id, bay));
INSERT INTO bay VALUES ('level-1', 40) ON CONFLICT DO NOTHING;";

struct CarPark;

#[async_trait::async_trait]
impl Resource for CarPark {
    async fn try_hold(
        &self,
        db: &mut PgConnection,
        b: &BranchCtx,
    ) -> Result<TryAnswer, ResourceError> {
        for item in &b.items {
            // Guarded decrement under the bay's row lock; zero rows means "full".
            let taken = sqlx::query("UPDATE bay SET free = free - $2 WHERE id = $1 AND free >= $2")
                .bind(&item.resource)
                .bind(item.quantity)
                .execute(&mut *db)
                .await?;
            if taken.rows_affected() == 0 {
                return Ok(TryAnswer::Rejected(format!("{} is full", item.resource)));
            }
            sqlx::query("INSERT INTO bay_hold VALUES ($1, $2, $3, 'held')")
                .bind(&b.key.branch_id)
                .bind(&item.resource)
                .bind(item.quantity)
                .execute(&mut *db)
                .await?;
        }
        Ok(TryAnswer::Held)
    }

    async fn confirm(
        &self,
        db: &mut PgConnection,
        b: &BranchCtx,
    ) -> Result<ConfirmOutcome, ResourceError> {
        let done = sqlx::query(
            "UPDATE bay_hold SET state = 'confirmed' WHERE branch_id = $1 AND state = 'held'",
        )
        .bind(&b.key.branch_id)
        .execute(&mut *db)
        .await?;
        Ok(if done.rows_affected() == b.items.len() as u64 {
            ConfirmOutcome::Confirmed
        } else {
            ConfirmOutcome::HoldLost
        })
    }

    async fn cancel(&self, db: &mut PgConnection, b: &BranchCtx) -> Result<(), ResourceError> {
        // Spaces come back only through the winning held -> cancelled transition.
        sqlx::query("WITH r AS (UPDATE bay_hold SET state = 'cancelled' WHERE branch_id = $1 AND state = 'held' \
                     RETURNING bay, spaces) UPDATE bay SET free = free + r.spaces FROM r WHERE bay.id = r.bay")
            .bind(&b.key.branch_id).execute(&mut *db).await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pool = db::connect_postgres(&std::env::var("DATABASE_URL")?, 8).await?;
    holdfast_participant::migrate(&pool).await?; // the barrier table
    sqlx::raw_sql(SCHEMA).execute(&pool).await?;
    let service = ParticipantService::new("car-park", CarPark, pool);
    let auth = match std::env::var_os("CAR_PARK_AUTH_KEYS") {
        Some(path) => auth::Authenticator::from_file("CAR_PARK_AUTH_KEYS", path.as_ref())?,
        None => auth::Authenticator::Off,
    };
    let listen = std::env::var("CAR_PARK_LISTEN").unwrap_or_else(|_| "127.0.0.1:50070".into());
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("car-park serving on {}", listener.local_addr()?);
    let routes = tonic::service::Routes::new(service.into_server());
    server::serve(
        listener,
        &auth,
        routes,
        &["tcc.v1.Participant"],
        server::shutdown_signal(),
    )
    .await?;
    Ok(())
}
