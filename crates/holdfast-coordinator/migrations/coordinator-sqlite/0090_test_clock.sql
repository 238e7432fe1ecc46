-- The test clock's offset (`holdfast --test-mode`, the testkit: `src/testing/`), added to every
-- clock read of this database (`db::sqlite_now_us!`). One row; zero, and never written,
-- outside test mode. Numbered apart so feature migrations keep their own sequence; the same
-- table in the coordinator's and the participants' schema (`IF NOT EXISTS`: they may share
-- a file).
CREATE TABLE IF NOT EXISTS holdfast_clock_offset (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    offset_us INTEGER NOT NULL CHECK (offset_us >= 0)
) STRICT;
INSERT OR IGNORE INTO holdfast_clock_offset (id, offset_us) VALUES (0, 0);
