//! Input validation for the coordinator: every limit of SPEC 3.2 and every rule on a request's
//! fields (ids, tokens, payments), checked before any write, each failure naming the offending
//! field.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use uuid::Uuid;

pub use super::field::FieldError;
use super::{Hold, NewReservation, Payment};

/// Bounds on every input (SPEC 3.2). Configurable; these defaults are the SPEC's.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Max bytes of `request_id`, `holder`, `resource`, `participant`.
    pub max_id_bytes: usize,
    pub max_holds: usize,
    pub min_ttl: Duration,
    pub max_ttl: Duration,
    pub default_ttl: Duration,
    pub max_labels: usize,
    /// Max bytes of each label key and value, and of a cancel reason.
    pub max_label_bytes: usize,
    pub max_page_size: u32,
    pub default_page_size: u32,
    /// The longest `queue.wait_up_to` a Reserve may ask (`--max-queue-wait`).
    pub max_queue_wait: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_id_bytes: 128,
            max_holds: 64,
            min_ttl: Duration::from_secs(1),
            max_ttl: Duration::from_secs(3600),
            default_ttl: Duration::from_secs(600),
            max_labels: 16,
            max_label_bytes: 256,
            max_page_size: 500,
            default_page_size: 50,
            max_queue_wait: Duration::from_secs(3600),
        }
    }
}

/// The longest ttl any configuration may allow (`--max-ttl`): far beyond any sensible hold, and
/// far inside what either database's timestamps can hold, so `now + ttl` (and an Extend's
/// push) never overflows.
pub const TTL_CEILING: Duration = Duration::from_secs(100 * 366 * 24 * 3600);

/// The range of a `google.protobuf.Timestamp`, 0001-01-01T00:00:00Z to
/// 9999-12-31T23:59:59.999999999Z, in seconds since the epoch: every database the coordinator
/// (and every reference participant) stores times in can hold it. PostgreSQL's `timestamptz`
/// ends at 4713 BC and 294276 AD, chrono's at about 262000 BC and AD.
pub const TIMESTAMP_SECONDS: std::ops::RangeInclusive<i64> = -62_135_596_800..=253_402_300_799;

/// The error of a timestamp outside [`TIMESTAMP_SECONDS`].
pub fn timestamp_out_of_range(field: &str) -> FieldError {
    FieldError::new(
        field,
        "is out of range: timestamps must lie between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z",
    )
}

/// Checks that a timestamp lies within [`TIMESTAMP_SECONDS`].
pub fn timestamp(field: &str, t: chrono::DateTime<chrono::Utc>) -> Result<(), FieldError> {
    if TIMESTAMP_SECONDS.contains(&t.timestamp()) {
        Ok(())
    } else {
        Err(timestamp_out_of_range(field))
    }
}

/// Text the databases cannot store: PostgreSQL's `text` and `jsonb` refuse NUL.
fn no_nul(field: &str, value: &str) -> Result<(), FieldError> {
    if value.contains('\0') {
        return Err(FieldError::new(field, "must not contain NUL characters"));
    }
    Ok(())
}

/// A Reserve request as received, before validation.
#[derive(Clone, Debug, Default)]
pub struct ReserveInput {
    pub request_id: String,
    pub holder: String,
    pub ttl: Option<Duration>,
    pub holds: Vec<Hold>,
    pub labels: HashMap<String, String>,
    /// Wait in a waitlist when refused for capacity (SPEC 11).
    pub queue: Option<super::waitlist::QueueOptions>,
}

/// Checks a required identifier: non-empty, at most `max` bytes, no control characters.
pub fn identifier(field: &str, value: &str, max: usize) -> Result<(), FieldError> {
    if value.is_empty() {
        return Err(FieldError::new(field, "is required"));
    }
    if value.len() > max {
        return Err(FieldError::new(
            field,
            format!("must be at most {max} bytes (got {})", value.len()),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(FieldError::new(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// A client's idempotency key (`request_id`), checked once where it enters: non-empty, at most
/// the configured bytes, no control characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RequestId(String);

impl RequestId {
    /// Parses a `request_id` field of at most `max` bytes.
    pub fn parse(value: &str, max: usize) -> Result<RequestId, FieldError> {
        identifier("request_id", value, max)?;
        Ok(RequestId(value.to_owned()))
    }

    /// The key as stored (and bound in SQL).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as text, for a reservation or an error that names it.
    pub(crate) fn into_string(self) -> String {
        self.0
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parses a reservation id: required, and a UUID.
pub fn reservation_id(value: &str) -> Result<Uuid, FieldError> {
    if value.is_empty() {
        return Err(FieldError::new("reservation_id", "is required"));
    }
    uuid("reservation_id", value)
}

/// Parses a UUID field.
pub fn uuid(field: &str, value: &str) -> Result<Uuid, FieldError> {
    Uuid::parse_str(value).map_err(|_| FieldError::new(field, "must be a UUID"))
}

/// Checks a presented hold token's shape; its value is compared by the store, in constant
/// time.
pub fn hold_token(value: &str) -> Result<(), FieldError> {
    if value.is_empty() {
        return Err(FieldError::new("hold_token", "is required"));
    }
    if value.len() > 256 {
        return Err(FieldError::new("hold_token", "must be at most 256 bytes"));
    }
    Ok(())
}

/// Checks a payment given to Confirm. `registered` says whether a participant name is
/// registered (the coordinator knows; this module does no I/O).
pub fn payment(
    p: &Payment,
    limits: &Limits,
    registered: impl Fn(&str) -> bool,
) -> Result<(), FieldError> {
    identifier("payment.participant", &p.participant, limits.max_id_bytes)?;
    if !registered(&p.participant) {
        return Err(FieldError::new(
            "payment.participant",
            format!("names no registered participant ({:?})", p.participant),
        ));
    }
    identifier("payment.payment_ref", &p.payment_ref, limits.max_id_bytes)?;
    if p.amount_minor <= 0 {
        return Err(FieldError::new("payment.amount_minor", "must be > 0"));
    }
    if p.currency.len() != 3 || !p.currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(FieldError::new(
            "payment.currency",
            "must be an ISO 4217 code such as \"EUR\"",
        ));
    }
    Ok(())
}

/// Checks a ttl against the limits, at the precision it is stored and applied with: whole
/// milliseconds (sub-millisecond digits are dropped here, so a byte-identical retry of a
/// Reserve compares equal to what was recorded).
pub fn ttl(field: &str, ttl: Duration, limits: &Limits) -> Result<Duration, FieldError> {
    let ttl = Duration::from_millis(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
    let max_ttl = limits.max_ttl.min(TTL_CEILING);
    if ttl < limits.min_ttl || ttl > max_ttl {
        return Err(FieldError::new(
            field,
            format!(
                "must be between {}s and {}s (got {:.3}s)",
                limits.min_ttl.as_secs(),
                max_ttl.as_secs(),
                ttl.as_secs_f64()
            ),
        ));
    }
    Ok(ttl)
}

/// Checks a free-text reason.
pub fn reason(field: &str, value: &str, limits: &Limits) -> Result<(), FieldError> {
    if value.len() > limits.max_label_bytes {
        return Err(FieldError::new(
            field,
            format!("must be at most {} bytes", limits.max_label_bytes),
        ));
    }
    no_nul(field, value)
}

/// One label (key and value): a key of 1..`max_label_bytes`, a value of at most that, no NUL;
/// errors name `labels["key"]`.
pub fn label(k: &str, v: &str, limits: &Limits) -> Result<(), FieldError> {
    let field = || format!("labels[{k:?}]");
    if k.is_empty() || k.len() > limits.max_label_bytes {
        return Err(FieldError::new(
            field(),
            format!("key must be 1..{} bytes", limits.max_label_bytes),
        ));
    }
    if v.len() > limits.max_label_bytes {
        return Err(FieldError::new(
            field(),
            format!("value must be at most {} bytes", limits.max_label_bytes),
        ));
    }
    no_nul(&field(), k)?;
    no_nul(&field(), v)
}

/// The most labels a List may filter on.
pub const MAX_LABEL_FILTERS: usize = 4;

/// The filters of a List: holder and participant identifiers, a time range that is one, at
/// most [`MAX_LABEL_FILTERS`] labels, each a label Reserve would take.
pub fn list_filters(query: &super::ListQuery, limits: &Limits) -> Result<(), FieldError> {
    if let Some(find) = &query.find {
        return lookup(find, query, limits);
    }
    if let Some(h) = &query.holder {
        identifier("holder", h, limits.max_id_bytes)?;
    }
    if let Some(p) = &query.participant {
        identifier("participant", p, limits.max_id_bytes)?;
    }
    if let (Some(after), Some(before)) = (query.created_after, query.created_before)
        && after >= before
    {
        return Err(FieldError::new(
            "created_after",
            "must be before created_before",
        ));
    }
    if query.labels.len() > MAX_LABEL_FILTERS {
        return Err(FieldError::new(
            "labels",
            format!(
                "may filter on at most {MAX_LABEL_FILTERS} labels (got {})",
                query.labels.len()
            ),
        ));
    }
    for (k, v) in &query.labels {
        label(k, v, limits)?;
    }
    Ok(())
}

/// A lookup (`id_prefix`, `request_id`) stands alone: no filter beside it.
fn lookup(find: &super::Find, query: &super::ListQuery, limits: &Limits) -> Result<(), FieldError> {
    let field = match find {
        super::Find::Ids { .. } => "id_prefix",
        super::Find::RequestId(id) => {
            identifier("request_id", id, limits.max_id_bytes)?;
            "request_id"
        }
    };
    let filtered = query.holder.is_some()
        || query.state.is_some()
        || query.participant.is_some()
        || query.created_after.is_some()
        || query.created_before.is_some()
        || !query.labels.is_empty();
    if filtered {
        return Err(FieldError::new(
            field,
            "is a lookup of its own: give no other filter with it",
        ));
    }
    Ok(())
}

/// Under which id, for whom, and with which token check a valid Reserve is recorded.
#[derive(Clone, Debug)]
pub struct RecordAs {
    pub id: uuid::Uuid,
    pub owner: String,
    pub token: super::TokenCheck,
}

/// The holds of a Reserve: 1..=`max_holds` of them, each valid, none repeated.
fn holds(holds: &[super::Hold], limits: &Limits) -> Result<(), FieldError> {
    if holds.is_empty() {
        return Err(FieldError::new("holds", "must contain at least 1 hold"));
    }
    if holds.len() > limits.max_holds {
        return Err(FieldError::new(
            "holds",
            format!(
                "must contain at most {} holds (got {})",
                limits.max_holds,
                holds.len()
            ),
        ));
    }
    for (i, h) in holds.iter().enumerate() {
        identifier(
            &format!("holds[{i}].participant"),
            &h.participant,
            limits.max_id_bytes,
        )?;
        identifier(
            &format!("holds[{i}].resource"),
            &h.resource,
            limits.max_id_bytes,
        )?;
        if h.quantity < 1 {
            return Err(FieldError::new(
                format!("holds[{i}].quantity"),
                format!("must be >= 1 (got {})", h.quantity),
            ));
        }
        if let Some(d) = h.during {
            timestamp(&format!("holds[{i}].during.start"), d.start)?;
            timestamp(&format!("holds[{i}].during.end"), d.end)?;
            if d.start >= d.end {
                return Err(FieldError::new(
                    format!("holds[{i}].during"),
                    "end must be after start",
                ));
            }
        }
    }
    // A resource listed twice would be held twice by one branch: ambiguous, so refused.
    let mut seen: HashMap<(&str, &str, Option<super::Interval>), usize> = HashMap::new();
    for (i, h) in holds.iter().enumerate() {
        if let Some(first) = seen.insert(h.canonical_key(), i) {
            return Err(FieldError::new(
                format!("holds[{i}]"),
                format!("repeats holds[{first}] (same participant, resource and slot)"),
            ));
        }
    }
    Ok(())
}

/// Validates a Reserve request and puts its holds in canonical order.
pub fn reserve(
    input: ReserveInput,
    limits: &Limits,
    record: RecordAs,
) -> Result<NewReservation, FieldError> {
    let request_id = RequestId::parse(&input.request_id, limits.max_id_bytes)?;
    identifier("holder", &input.holder, limits.max_id_bytes)?;
    let ttl = ttl("ttl", input.ttl.unwrap_or(limits.default_ttl), limits)?;

    holds(&input.holds, limits)?;

    if input.labels.len() > limits.max_labels {
        return Err(FieldError::new(
            "labels",
            format!(
                "must have at most {} entries (got {})",
                limits.max_labels,
                input.labels.len()
            ),
        ));
    }
    let labels: BTreeMap<String, String> = input.labels.into_iter().collect();
    for (k, v) in &labels {
        label(k, v, limits)?;
    }

    let queue_wait = input
        .queue
        .map(|q| super::waitlist::wait_up_to(q.wait_up_to, limits.max_queue_wait))
        .transpose()?;
    let mut holds = input.holds;
    holds.sort_by(|a, b| a.canonical_key().cmp(&b.canonical_key()));
    Ok(NewReservation {
        id: record.id,
        owner: record.owner,
        token: record.token,
        request_id,
        holder: input.holder,
        ttl,
        holds,
        labels,
        queue_wait,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> RecordAs {
        RecordAs {
            id: uuid::Uuid::now_v7(),
            owner: String::new(),
            token: crate::domain::HoldToken::generate().unwrap().check(None),
        }
    }

    fn hold(p: &str, r: &str, q: i64) -> Hold {
        Hold {
            participant: p.into(),
            resource: r.into(),
            quantity: q,
            during: None,
        }
    }

    fn input() -> ReserveInput {
        ReserveInput {
            queue: None,
            request_id: "r1".into(),
            holder: "u1".into(),
            ttl: None,
            holds: vec![
                hold("stock", "b", 1),
                hold("seats", "z", 1),
                hold("seats", "a", 1),
            ],
            labels: HashMap::new(),
        }
    }

    #[test]
    fn ttl_is_kept_to_the_millisecond_it_is_stored_with() {
        let limits = Limits::default();
        let fine = Duration::new(60, 500_999);
        assert_eq!(ttl("ttl", fine, &limits), Ok(Duration::from_millis(60_000)));
        let fine = Duration::new(1, 1_999_999);
        assert_eq!(ttl("ttl", fine, &limits), Ok(Duration::from_millis(1_001)));
    }

    #[test]
    fn sorts_holds_canonically_and_defaults_ttl() {
        let r = reserve(input(), &Limits::default(), record()).unwrap();
        let keys: Vec<_> = r
            .holds
            .iter()
            .map(|h| (h.participant.as_str(), h.resource.as_str()))
            .collect();
        assert_eq!(keys, [("seats", "a"), ("seats", "z"), ("stock", "b")]);
        assert_eq!(r.ttl, Duration::from_secs(600));
    }

    #[test]
    fn checks_ids_tokens_and_payments() {
        assert_eq!(reservation_id("").unwrap_err().problem, "is required");
        assert_eq!(reservation_id("x").unwrap_err().problem, "must be a UUID");
        assert_eq!(
            uuid("reservation_id", "").unwrap_err().problem,
            "must be a UUID"
        );
        assert!(hold_token(&"t".repeat(256)).is_ok());
        assert_eq!(
            hold_token(&"t".repeat(257)).unwrap_err().field,
            "hold_token"
        );
        let l = Limits::default();
        let good = Payment {
            participant: "payments".into(),
            payment_ref: "p1".into(),
            amount_minor: 100,
            currency: "EUR".into(),
        };
        assert!(payment(&good, &l, |_| true).is_ok());
        let unregistered = payment(&good, &l, |_| false).unwrap_err();
        assert_eq!(unregistered.field, "payment.participant");
        // Checked in field order: an unregistered participant is named before a bad currency.
        let mut bad = good.clone();
        bad.currency = "eur".into();
        assert_eq!(
            payment(&bad, &l, |_| true).unwrap_err().field,
            "payment.currency"
        );
        assert_eq!(
            payment(&bad, &l, |_| false).unwrap_err().field,
            "payment.participant"
        );
    }

    #[test]
    fn names_the_offending_field() {
        let l = Limits::default();
        let mut i = input();
        i.holds[2].quantity = 0;
        assert_eq!(
            reserve(i, &l, record()).unwrap_err().field,
            "holds[2].quantity"
        );
        let mut i = input();
        i.request_id = "x".repeat(129);
        assert_eq!(reserve(i, &l, record()).unwrap_err().field, "request_id");
        let mut i = input();
        i.holder.clear();
        assert_eq!(reserve(i, &l, record()).unwrap_err().field, "holder");
        let mut i = input();
        i.ttl = Some(Duration::from_millis(500));
        assert_eq!(reserve(i, &l, record()).unwrap_err().field, "ttl");
        let mut i = input();
        i.holds = (0..65).map(|n| hold("seats", &n.to_string(), 1)).collect();
        assert_eq!(reserve(i, &l, record()).unwrap_err().field, "holds");
        let mut i = input();
        i.holds.push(hold("seats", "a", 2));
        assert_eq!(reserve(i, &l, record()).unwrap_err().field, "holds[3]");
        let mut i = input();
        i.labels = (0..17).map(|n| (n.to_string(), String::new())).collect();
        assert_eq!(reserve(i, &l, record()).unwrap_err().field, "labels");
    }

    #[test]
    fn values_no_database_can_hold_are_refused_before_any_write() {
        let l = Limits::default();
        let at = |secs: i64| chrono::DateTime::from_timestamp(secs, 0).unwrap();
        // 5000 BC: chrono holds it, PostgreSQL's timestamptz does not.
        let mut i = input();
        i.holds[0].during = Some(super::super::Interval {
            start: at(-219_915_000_000),
            end: at(-219_914_000_000),
        });
        let e = reserve(i, &l, record()).unwrap_err();
        assert_eq!(e.field, "holds[0].during.start");
        assert!(e.problem.contains("out of range"), "{e}");
        let mut i = input();
        i.holds[0].during = Some(super::super::Interval {
            start: at(0),
            end: at(253_402_300_800),
        });
        assert_eq!(
            reserve(i, &l, record()).unwrap_err().field,
            "holds[0].during.end"
        );
        let mut i = input();
        i.labels.insert("k".into(), "a\0b".into());
        assert_eq!(reserve(i, &l, record()).unwrap_err().field, "labels[\"k\"]");
        assert_eq!(reason("reason", "a\0", &l).unwrap_err().field, "reason");
        // However wide the configured max_ttl, a ttl stays within the ceiling.
        let wide = Limits {
            max_ttl: Duration::MAX,
            ..Limits::default()
        };
        let far = TTL_CEILING + Duration::from_secs(1);
        assert_eq!(ttl("ttl", far, &wide).unwrap_err().field, "ttl");
        assert!(ttl("ttl", TTL_CEILING, &wide).is_ok());
    }
}
