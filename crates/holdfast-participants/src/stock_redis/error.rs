//! [`StockRedisError`], the errors of `stock-redis`, and their one mapping to gRPC statuses
//! (request errors as the SDK words them, Redis trouble as `UNAVAILABLE`).

use tonic::Status;

use crate::participant::ResourceError;

/// Errors of the stock-redis participant; mapped to [`Status`] in one place (`From` below).
#[derive(Debug, thiserror::Error)]
pub enum StockRedisError {
    /// A request field is missing or malformed.
    #[error("{field} {message}")]
    InvalidArgument {
        /// The offending field (`items[2].quantity`).
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A named resource does not exist.
    #[error("{0}")]
    NotFound(String),
    /// Refused in the current state; nothing changed.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The Redis data set is being rebuilt; retry shortly.
    #[error("the Redis data set is being rebuilt")]
    Rebuilding,
    /// Redis failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Postgres failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// Applying the schema failed.
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A broken invariant in stored data.
    #[error("internal: {0}")]
    Internal(String),
    /// A setting that cannot be used (it names the flag), found at start.
    #[error("{0}")]
    Settings(String),
}

impl StockRedisError {
    pub(super) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl From<ResourceError> for StockRedisError {
    fn from(err: ResourceError) -> Self {
        match err {
            ResourceError::InvalidArgument { field, message } => {
                Self::InvalidArgument { field, message }
            }
            ResourceError::NotFound(m) => Self::NotFound(m),
            ResourceError::FailedPrecondition(m) => Self::FailedPrecondition(m),
            ResourceError::Database(e) => Self::Database(e),
            ResourceError::Internal(m) => Self::Internal(m),
        }
    }
}

impl From<StockRedisError> for Status {
    fn from(err: StockRedisError) -> Self {
        match err {
            StockRedisError::InvalidArgument { field, message } => {
                ResourceError::invalid(field, message).into()
            }
            StockRedisError::NotFound(m) => Status::not_found(m),
            StockRedisError::FailedPrecondition(m) => Status::failed_precondition(m),
            StockRedisError::Rebuilding => {
                Status::unavailable("the Redis data set is being rebuilt; retry")
            }
            StockRedisError::Database(e) => ResourceError::Database(e).into(),
            StockRedisError::Redis(e) => {
                tracing::warn!(error = %e, "redis failure");
                Status::unavailable("redis temporarily unavailable; retry")
            }
            err @ (StockRedisError::Migrate(_)
            | StockRedisError::Internal(_)
            | StockRedisError::Settings(_)) => {
                tracing::error!(error = %err, "internal failure");
                Status::internal("internal error")
            }
        }
    }
}
