//! Errors of participant code and their one mapping to gRPC statuses.
//!
//! Business "can't" is not an error (it is `TryAnswer::Rejected`); these are for bad input,
//! missing things, refused admin changes and database trouble.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// An error of participant code (the SDK, a [`crate::Resource`], or an admin or
/// payments service built on them). Convert to a [`Status`] with `Status::from`.
#[derive(Debug, thiserror::Error)]
pub enum ResourceError {
    /// A request field is missing or malformed; `field` names it (`items[2].quantity`).
    #[error("{field} {message}")]
    InvalidArgument {
        /// The offending field, as a path into the request.
        field: String,
        /// What is wrong with it ("must be >= 1").
        message: String,
    },
    /// A named thing does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request is well-formed but refused in the current state; nothing changed.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The database failed; details are logged, never sent to the caller.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// A broken invariant in stored data; details are logged, never sent.
    #[error("internal: {0}")]
    Internal(String),
}

impl ResourceError {
    /// Shorthand for [`ResourceError::InvalidArgument`].
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }

    /// True for an exclusion-constraint violation (SQLSTATE 23P01): a slot already taken.
    pub fn is_exclusion_violation(&self) -> bool {
        self.sqlstate().as_deref() == Some("23P01")
    }

    fn sqlstate(&self) -> Option<String> {
        match self {
            Self::Database(sqlx::Error::Database(db)) => db.code().map(|c| c.into_owned()),
            _ => None,
        }
    }

    /// Whether a retry may succeed: connection trouble, serialisation failure, deadlock,
    /// lock timeout, server shutting down, a read-only server (`25006`: a primary demoted to a
    /// standby at a failover; the next connection reaches the new primary); on SQLite the write
    /// lock not obtained within the busy timeout (`SQLITE_BUSY` 5 and its extended codes,
    /// `SQLITE_LOCKED` 6).
    fn is_transient(&self) -> bool {
        match self {
            Self::Database(sqlx::Error::Database(_)) => {
                let code = self.sqlstate().unwrap_or_default();
                code.starts_with("08")
                    || code.starts_with("40")
                    || code.starts_with("53")
                    || code.starts_with("57")
                    || code == "55P03"
                    || code == "25006"
                    || matches!(code.as_str(), "5" | "6" | "261" | "517" | "262")
            }
            Self::Database(
                sqlx::Error::Io(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed
                | sqlx::Error::Tls(_)
                | sqlx::Error::Protocol(_),
            ) => true,
            _ => false,
        }
    }
}

const DOMAIN: &str = "tcc.v1";

impl From<ResourceError> for Status {
    fn from(err: ResourceError) -> Self {
        match &err {
            ResourceError::InvalidArgument { field, .. } => Status::with_error_details(
                Code::InvalidArgument,
                err.to_string(),
                ErrorDetails::with_error_info(
                    "INVALID_ARGUMENT",
                    DOMAIN,
                    [("field".to_owned(), field.clone())],
                ),
            ),
            ResourceError::NotFound(msg) => Status::not_found(msg.clone()),
            ResourceError::FailedPrecondition(msg) => Status::failed_precondition(msg.clone()),
            ResourceError::Database(_) if err.is_transient() => {
                tracing::warn!(error = %err, "transient database failure");
                Status::unavailable("database temporarily unavailable; retry")
            }
            ResourceError::Database(_) | ResourceError::Internal(_) => {
                tracing::error!(error = %err, "internal failure");
                Status::internal("internal error")
            }
        }
    }
}
