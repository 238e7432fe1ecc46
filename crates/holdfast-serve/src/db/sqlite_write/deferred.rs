//! A write whose opening statement waits for its first query ([`SqliteWriteAhead`]): the
//! query spelled both ways ([`FirstQuery`]), and what the writer learns of whether the opening
//! ran.

use sqlx::sqlite::SqliteConnection;

use super::{Opened, Part, SqliteWrite};

/// A deferred write's first query, as an opener sends it (after `BEGIN IMMEDIATE`) and as a
/// joiner sends it (after its savepoint). Built by [`sqlite_first_query!`](crate::sqlite_first_query).
#[derive(Clone, Copy, Debug)]
pub struct FirstQuery {
    opener: &'static str,
    joiner: &'static str,
}

impl FirstQuery {
    /// The two forms of one query; use [`sqlite_first_query!`](crate::sqlite_first_query).
    #[doc(hidden)]
    pub const fn new(opener: &'static str, joiner: &'static str) -> FirstQuery {
        FirstQuery { opener, joiner }
    }
}

/// A [`FirstQuery`] from the text of a query (literals and macros, as `concat!` takes them):
/// `BEGIN IMMEDIATE; ` or `SAVEPOINT holdfast_member; ` ahead of it.
#[macro_export]
macro_rules! sqlite_first_query {
    ($($sql:tt)*) => {
        $crate::db::FirstQuery::new(
            concat!("BEGIN IMMEDIATE; ", $($sql)*),
            concat!("SAVEPOINT holdfast_member; ", $($sql)*),
        )
    };
}

/// A write transaction on a SQLite pool's writer whose opening statement is not sent yet
/// ([`crate::db::begin_sqlite_write_deferred`]): its first query opens it. Dropped instead, it
/// wrote nothing and leaves the writer as it found it.
#[derive(Debug)]
pub struct SqliteWriteAhead(pub(in crate::db) SqliteWrite);

impl SqliteWriteAhead {
    /// The text of `query` this write sends as its first query (its opening ahead of it), and
    /// the connection to send it on: call it once, send that text before anything else, and
    /// hand what it answered to [`SqliteWriteAhead::opened`].
    pub fn first(&mut self, query: FirstQuery) -> (&'static str, &mut SqliteConnection) {
        let text = match self.0.part {
            Part::Joiner => query.joiner,
            Part::Opener | Part::Committing => query.opener,
        };
        self.0.abandon.writer.state().opened = Opened::Unknown;
        (text, &mut self.0.conn)
    }

    /// What the first query answered: `Ok`, the write goes on as a [`SqliteWrite`]; an error
    /// ends it (dropped: its part undone before the writer's next write).
    pub fn opened<T>(self, ran: Result<T, sqlx::Error>) -> Result<(T, SqliteWrite), sqlx::Error> {
        // An answer from SQLite, even an error, comes after the statements ahead of the one
        // that failed ran, the opening first of them.
        if ran.is_ok() || matches!(ran, Err(sqlx::Error::Database(_))) {
            self.0.abandon.writer.state().opened = Opened::Yes;
        }
        ran.map(|answer| (answer, self.0))
    }
}
