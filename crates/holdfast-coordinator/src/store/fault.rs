//! What a storage failure means for the caller, decided in one place for both databases:
//! [`Fault::Transient`] (retry the same request later), [`Fault::OutOfRange`] (the request holds
//! a value the database cannot store; retrying cannot help) or [`Fault::Internal`] (a bug or a
//! broken database: logged, answered without its details).
//!
//! Transient: the connection (I/O, TLS, a stream that is not PostgreSQL's protocol - a proxy
//! with no server behind it answers a TLS request by closing -, a closed or timed-out pool, PostgreSQL class `08`, a
//! server shutting down or not accepting connections yet `57P01`..`57P03`, too many connections
//! and other resource shortages, class `53`), a statement cancelled by its timeout (`57014`), a
//! serialization failure or deadlock (`40001`, `40P01`, `40003`), a lock not available
//! (`55P03`), a read-only standby after a failover (`25006`); on SQLite a busy or locked
//! database (`SQLITE_BUSY`, `SQLITE_LOCKED`), a full disk, an I/O error, out of memory.
//! Out of range: PostgreSQL class `22` (data exception: a timestamp, interval or number out of
//! range, a NUL in text) and `54` (a value past a program limit), SQLite's `SQLITE_TOOBIG`, and
//! a value sqlx could not encode. Everything else (constraint violations the code does not
//! expect, undefined columns, decode failures, protocol errors) is internal.

/// The class of a storage failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Retry the same request later.
    Transient,
    /// A value in the request is out of the range the database can store.
    OutOfRange,
    /// Anything else: not the caller's to fix.
    Internal,
}

/// The class of an sqlx error.
pub(crate) fn of_sqlx(e: &sqlx::Error) -> Fault {
    use sqlx::Error as E;
    match e {
        E::Io(_)
        | E::Tls(_)
        | E::Protocol(_)
        | E::PoolTimedOut
        | E::PoolClosed
        | E::WorkerCrashed => Fault::Transient,
        E::Encode(_) => Fault::OutOfRange,
        E::Database(db) => {
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                of_sqlstate(pg.code())
            } else if let Some(code) = db
                .try_downcast_ref::<sqlx::sqlite::SqliteError>()
                .and_then(sqlx::error::DatabaseError::code)
                .and_then(|c| c.parse::<i32>().ok())
            {
                of_sqlite_code(code)
            } else {
                Fault::Internal
            }
        }
        _ => Fault::Internal,
    }
}

/// The class of a PostgreSQL error by its SQLSTATE.
pub(crate) fn of_sqlstate(code: &str) -> Fault {
    match code {
        "40001" | "40P01" | "40003" | "55P03" | "57014" | "57P01" | "57P02" | "57P03" | "25006" => {
            Fault::Transient
        }
        c if c.starts_with("08") || c.starts_with("53") => Fault::Transient,
        c if c.starts_with("22") || c.starts_with("54") => Fault::OutOfRange,
        _ => Fault::Internal,
    }
}

/// The class of a SQLite error by its (extended) result code.
pub(crate) fn of_sqlite_code(code: i32) -> Fault {
    // The primary result code is the low byte of an extended one.
    match code & 0xff {
        // SQLITE_BUSY, SQLITE_LOCKED, SQLITE_NOMEM, SQLITE_IOERR, SQLITE_FULL, SQLITE_PROTOCOL
        5 | 6 | 7 | 10 | 13 | 15 => Fault::Transient,
        // SQLITE_TOOBIG
        18 => Fault::OutOfRange,
        _ => Fault::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_faults_serialization_failures_and_deadlocks_are_transient() {
        for code in [
            "40001", "40P01", "08006", "08001", "57P01", "57P03", "53300", "55P03", "57014",
        ] {
            assert_eq!(of_sqlstate(code), Fault::Transient, "{code}");
        }
        for e in [
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
            sqlx::Error::WorkerCrashed,
            sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
        ] {
            assert_eq!(of_sqlx(&e), Fault::Transient, "{e}");
        }
        // SQLITE_BUSY, SQLITE_BUSY_SNAPSHOT (517), SQLITE_LOCKED, SQLITE_IOERR_FSYNC (1034)
        for code in [5, 517, 6, 1034] {
            assert_eq!(of_sqlite_code(code), Fault::Transient, "{code}");
        }
    }

    #[test]
    fn values_the_database_cannot_hold_are_out_of_range() {
        // datetime_field_overflow, numeric_value_out_of_range, interval_field_overflow,
        // character_not_in_repertoire (a NUL), untranslatable_character, program_limit_exceeded
        for code in ["22008", "22003", "22015", "22021", "22P05", "54000"] {
            assert_eq!(of_sqlstate(code), Fault::OutOfRange, "{code}");
        }
        assert_eq!(of_sqlite_code(18), Fault::OutOfRange);
        let encode = sqlx::Error::Encode("NaiveDateTime out of range for Postgres".into());
        assert_eq!(of_sqlx(&encode), Fault::OutOfRange);
    }

    #[test]
    fn everything_else_is_internal() {
        // unique and check violations the code did not expect, an undefined column, a syntax
        // error; SQLITE_CONSTRAINT_UNIQUE (2067), SQLITE_ERROR, SQLITE_CORRUPT
        for code in ["23505", "23514", "42703", "42601", "XX000"] {
            assert_eq!(of_sqlstate(code), Fault::Internal, "{code}");
        }
        for code in [2067, 1, 11] {
            assert_eq!(of_sqlite_code(code), Fault::Internal, "{code}");
        }
        for e in [
            sqlx::Error::RowNotFound,
            sqlx::Error::ColumnNotFound("refund_state".into()),
        ] {
            assert_eq!(of_sqlx(&e), Fault::Internal, "{e}");
        }
    }

    /// A proxy in front of PostgreSQL (HAProxy, a Kubernetes Service) while no primary is
    /// behind it accepts a connection and closes it: a TLS request then fails as a protocol
    /// error, which is the failover's window, not a bug (it was answered INTERNAL).
    #[tokio::test]
    async fn a_proxy_closing_the_connection_at_the_tls_request_is_transient() {
        use sqlx::ConnectOptions;
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = proxy.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((conn, _)) = proxy.accept().await {
                // Takes the request (8 bytes), then closes: end of stream, no reset.
                let mut request = [0u8; 8];
                let mut taken = 0;
                while taken < request.len() && conn.readable().await.is_ok() {
                    match conn.try_read(&mut request[taken..]) {
                        Ok(0) => break,
                        Ok(n) => taken += n,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(_) => break,
                    }
                }
                drop(conn);
            }
        });
        let options = sqlx::postgres::PgConnectOptions::new()
            .host("127.0.0.1")
            .port(port)
            .username("postgres")
            .ssl_mode(sqlx::postgres::PgSslMode::Require);
        let refused = options.connect().await.unwrap_err();
        assert_eq!(of_sqlx(&refused), Fault::Transient, "{refused:?}");
    }

    #[tokio::test]
    async fn a_real_sqlite_error_is_classified_by_its_code() {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .connect("sqlite::memory:")
            .await
            .unwrap();
        sqlx::query("CREATE TABLE t (x INTEGER NOT NULL CHECK (x > 0))")
            .execute(&pool)
            .await
            .unwrap();
        let check = sqlx::query("INSERT INTO t VALUES (0)")
            .execute(&pool)
            .await
            .unwrap_err();
        assert_eq!(of_sqlx(&check), Fault::Internal, "{check}");
        let too_big = sqlx::query("SELECT zeroblob(2000000000)")
            .execute(&pool)
            .await
            .unwrap_err();
        assert_eq!(of_sqlx(&too_big), Fault::OutOfRange, "{too_big}");
    }
}
