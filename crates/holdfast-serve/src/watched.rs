//! Files that are re-read when they change, so a renewal (cert-manager replacing a Secret's
//! certificate files, an operator editing the principals file) takes effect without a restart.
//!
//! A [`Watched`] value is built from the bytes of its files. A background task reads them again
//! every [`CHECK_EVERY`]; when the bytes differ from those the current value was built from, it
//! builds a new value and swaps it in (connections already open keep theirs). Comparing bytes
//! rather than modification times also catches Kubernetes' symlink swaps and copies that keep
//! the timestamp. A change that cannot be used (a key that does not match, an expired
//! certificate, a half-written file) is logged at ERROR once, counted in the owner's metric if
//! it names one ([`Watched::load_counting`]), and the previous value stays in use; the next
//! change is tried again.
//! Used by `tls` (certificates) and `auth` (principals); it knows nothing of either.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;

/// How often watched files are checked for changes. Renewals happen days before expiry and a
/// revoked key should stop working promptly, so a few seconds; each check reads a few small
/// files.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(5);

/// A watched file that cannot be used, naming the setting and the path.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{flag} {path}: cannot read it: {source}")]
    Read {
        flag: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("{flag} {path}: {problem}")]
    Invalid {
        flag: &'static str,
        path: String,
        problem: String,
    },
}

/// One input file and the setting that named it (errors name both).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub flag: &'static str,
    pub path: PathBuf,
}

impl Source {
    pub fn new(flag: &'static str, path: &std::path::Path) -> Source {
        Source {
            flag,
            path: path.to_owned(),
        }
    }

    /// Reads the whole file.
    pub fn read(&self) -> Result<Vec<u8>, FileError> {
        std::fs::read(&self.path).map_err(|source| FileError::Read {
            flag: self.flag,
            path: self.path.display().to_string(),
            source,
        })
    }

    /// An error about this file's content.
    pub fn invalid(&self, problem: impl std::fmt::Display) -> FileError {
        FileError::Invalid {
            flag: self.flag,
            path: self.path.display().to_string(),
            problem: problem.to_string(),
        }
    }
}

/// Builds the value from the files' bytes, in the order of the sources; an error is a message.
type Build<T> = Box<dyn Fn(&[Vec<u8>]) -> Result<T, String> + Send + Sync>;

/// A value built from files, rebuilt when they change.
pub struct Watched<T> {
    /// What the files are, for the log ("certificate files", "principals file").
    what: &'static str,
    sources: Vec<Source>,
    build: Build<T>,
    /// The counter a refused change increments, if any (`holdfast_tls_reload_failures_total`).
    refusals_counter: Option<&'static str>,
    current: ArcSwap<T>,
    seen: Mutex<Seen>,
}

/// Fingerprints of the files' bytes: those `current` was built from, and the last ones that
/// could not be used (so a bad change is reported once, not every check); and how many
/// changes were applied and refused.
struct Seen {
    loaded: u64,
    failed: Option<u64>,
    applied: u64,
    refused: u64,
}

/// How many changes of the files a [`Watched`] value applied and refused (each distinct
/// content once): what a caller can wait for instead of guessing when the next check runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub applied: u64,
    pub refused: u64,
}

impl<T: Send + Sync + 'static> Watched<T> {
    /// Reads the files and builds the first value; any error is returned (a server must not
    /// start with unusable certificates or principals). Starts the background check when there
    /// are files to watch and a Tokio runtime to run it on; it ends when the value is dropped.
    pub fn load<E>(
        what: &'static str,
        sources: Vec<Source>,
        every: Duration,
        build: impl Fn(&[Vec<u8>]) -> Result<T, E> + Send + Sync + 'static,
    ) -> Result<Arc<Watched<T>>, E>
    where
        E: From<FileError> + std::fmt::Display,
    {
        Watched::load_counting(what, None, sources, every, build)
    }

    /// [`Watched::load`], incrementing the counter `refusals_counter` (a metric name) for
    /// each change refused.
    pub(crate) fn load_counting<E>(
        what: &'static str,
        refusals_counter: Option<&'static str>,
        sources: Vec<Source>,
        every: Duration,
        build: impl Fn(&[Vec<u8>]) -> Result<T, E> + Send + Sync + 'static,
    ) -> Result<Arc<Watched<T>>, E>
    where
        E: From<FileError> + std::fmt::Display,
    {
        let bytes = read_all(&sources)?;
        let first = build(&bytes)?;
        if let Some(counter) = refusals_counter {
            // Scraped from the start (at 0), so a rate over it sees the first refusal.
            metrics::counter!(counter).increment(0);
        }
        let watched = Arc::new(Watched {
            what,
            sources,
            build: Box::new(move |bytes| build(bytes).map_err(|e| e.to_string())),
            refusals_counter,
            current: ArcSwap::from_pointee(first),
            seen: Mutex::new(Seen {
                loaded: fingerprint(&bytes),
                failed: None,
                applied: 0,
                refused: 0,
            }),
        });
        if !watched.sources.is_empty() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(check_periodically(Arc::downgrade(&watched), every));
                }
                Err(_) => tracing::warn!(
                    files = %watched.describe(),
                    "no Tokio runtime: these {} will not be re-read when they change",
                    watched.what
                ),
            }
        }
        Ok(watched)
    }

    /// The value built from the files as they were at the last successful check.
    pub fn current(&self) -> Arc<T> {
        self.current.load_full()
    }

    /// The changes applied and refused since the first load.
    pub fn changes(&self) -> Changes {
        let seen = match self.seen.lock() {
            Ok(seen) => seen,
            Err(poisoned) => poisoned.into_inner(),
        };
        Changes {
            applied: seen.applied,
            refused: seen.refused,
        }
    }

    /// Reads the files and, if they changed since the last check, rebuilds the value. A change
    /// that cannot be used keeps the previous value and is logged once.
    pub(crate) fn check(&self) {
        let (print, outcome) = match read_all(&self.sources) {
            Ok(bytes) => (fingerprint(&bytes), Ok(bytes)),
            Err(e) => (fingerprint(&[e.to_string().into_bytes()]), Err(e)),
        };
        let mut seen = match self.seen.lock() {
            Ok(seen) => seen,
            Err(poisoned) => poisoned.into_inner(),
        };
        if print == seen.loaded || Some(print) == seen.failed {
            return;
        }
        match outcome
            .map_err(|e| e.to_string())
            .and_then(|bytes| (self.build)(&bytes))
        {
            Ok(value) => {
                self.current.store(Arc::new(value));
                seen.loaded = print;
                seen.failed = None;
                seen.applied += 1;
                tracing::info!(files = %self.describe(), "{} changed: now using the new ones", self.what);
            }
            Err(e) => {
                seen.failed = Some(print);
                seen.refused += 1;
                if let Some(counter) = self.refusals_counter {
                    metrics::counter!(counter).increment(1);
                }
                tracing::error!(
                    error = %e,
                    "{} changed but cannot be used; keeping the previous ones until they are fixed",
                    self.what
                );
            }
        }
    }

    fn describe(&self) -> String {
        self.sources
            .iter()
            .map(|s| format!("{} {}", s.flag, s.path.display()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Checks `watched` every `every` until it is dropped. Reading files is blocking I/O, so each
/// check runs on the blocking pool.
async fn check_periodically<T: Send + Sync + 'static>(watched: Weak<Watched<T>>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(watched) = watched.upgrade() else {
            return;
        };
        let _ = tokio::task::spawn_blocking(move || watched.check()).await;
    }
}

fn read_all(sources: &[Source]) -> Result<Vec<Vec<u8>>, FileError> {
    sources.iter().map(Source::read).collect()
}

/// A fingerprint of the files' bytes, to tell a change from the same content read again (not a
/// security check: the content itself is validated when it is built).
fn fingerprint(files: &[Vec<u8>]) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    files.hash(&mut hasher);
    hasher.finish()
}
