//! The CLI's human output: aligned tables and a reservation's page (state, age, expires in,
//! branches, last error, refund, audit). Times are shown relative to the caller's clock.

use chrono::{DateTime, Utc};

use super::json::utc;
use crate::proto::{self, reservation::State};

/// Columns aligned with two spaces between them; the last column is not padded.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let pad = widths[i] - cell.chars().count() + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    }
    out
}

/// The reservations table of `list` and `admin stuck`.
pub fn reservations(list: &[proto::Reservation], now: DateTime<Utc>) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|r| {
            vec![
                r.id.clone(),
                r.state().as_str_name().to_owned(),
                r.holder.clone(),
                age(r, now),
                expires_in(r, now),
                branch_counts(r),
                last_error(r),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "STATE",
            "HOLDER",
            "AGE",
            "EXPIRES IN",
            "BRANCHES",
            "LAST ERROR",
        ],
        &rows,
    )
}

/// One reservation, whole.
pub fn reservation(r: &proto::Reservation, now: DateTime<Utc>) -> String {
    let mut fields = vec![
        ("id", r.id.clone()),
        ("state", r.state().as_str_name().to_owned()),
        ("holder", r.holder.clone()),
        ("request id", r.request_id.clone()),
        (
            "created",
            format!("{} ({} ago)", at(r.created_at.as_ref()), age(r, now)),
        ),
        ("expires", expires(r, now)),
        ("extensions", r.extensions_used.to_string()),
    ];
    if r.late_payment_honored {
        fields.push(("late payment", "honoured".to_owned()));
    }
    if let Some(q) = &r.queue {
        fields.push(("queued", queue_place(q)));
        fields.push(("waits until", until(q.until.as_ref(), now)));
    }
    if let Some(x) = &r.rejection {
        fields.push((
            "rejected by",
            format!("{}/{}: {}", x.participant, x.resource, x.reason),
        ));
    }
    if let Some(x) = &r.refund {
        let mut refund = format!(
            "{} {} {} (refund {})",
            x.state().as_str_name(),
            x.amount_minor,
            x.currency,
            x.refund_id
        );
        if !x.failure_reason.is_empty() {
            refund.push_str(&format!(": {}", x.failure_reason));
        }
        fields.push(("refund", refund));
    }
    let mut labels: Vec<_> = r.labels.iter().collect();
    labels.sort();
    if !labels.is_empty() {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        fields.push(("labels", labels.join(" ")));
    }
    let mut out = String::new();
    for (name, value) in fields {
        out.push_str(&format!("{name:<12}{value}\n"));
    }
    out.push('\n');
    out.push_str(&branches(&r.branches));
    if !r.payments.is_empty() {
        out.push('\n');
        out.push_str(&payments(&r.payments));
    }
    if !r.audit.is_empty() {
        out.push('\n');
        out.push_str(&audit(&r.audit));
    }
    out
}

/// When the holds lapse; a QUEUED reservation holds nothing, so nothing lapses.
fn expires(r: &proto::Reservation, now: DateTime<Utc>) -> String {
    if r.state() == State::Queued {
        return "- (queued: nothing is held)".to_owned();
    }
    format!("{} ({})", at(r.expires_at.as_ref()), expires_in(r, now))
}

/// The branches table: each hold, its state, attempts and last error.
fn branches(branches: &[proto::Branch]) -> String {
    let rows: Vec<Vec<String>> = branches
        .iter()
        .map(|b| {
            vec![
                b.participant.clone(),
                b.resource.clone(),
                b.quantity.to_string(),
                b.state().as_str_name().to_owned(),
                b.attempts.to_string(),
                b.last_error.clone(),
            ]
        })
        .collect();
    table(
        &[
            "PARTICIPANT",
            "RESOURCE",
            "QTY",
            "STATE",
            "ATTEMPTS",
            "LAST ERROR",
        ],
        &rows,
    )
}

/// The payments table: every recorded payment and what became of it.
pub fn payments(records: &[proto::reservation::PaymentRecord]) -> String {
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|p| {
            vec![
                p.participant.clone(),
                p.payment_ref.clone(),
                format!("{} {}", p.amount_minor, p.currency),
                p.state().as_str_name().to_owned(),
                p.refund_id.clone(),
            ]
        })
        .collect();
    table(
        &["PAYMENTS", "PAYMENT REF", "AMOUNT", "STATE", "REFUND"],
        &rows,
    )
}

/// The audit table.
pub fn audit(entries: &[proto::AuditEntry]) -> String {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|a| {
            let target = match (a.reservation_id.is_empty(), a.participant.is_empty()) {
                (false, _) => a.reservation_id.clone(),
                (true, false) => format!("participant {}", a.participant),
                (true, true) => "-".to_owned(),
            };
            vec![
                at(a.at.as_ref()),
                a.principal.clone(),
                a.action.clone(),
                target,
                a.reason.clone(),
            ]
        })
        .collect();
    table(&["AT", "PRINCIPAL", "ACTION", "ON", "REASON"], &rows)
}

/// The event sinks table: how far each delivered, how far behind it is, and why it fails.
pub(crate) fn sinks(sinks: &[proto::Sink], now: DateTime<Utc>) -> String {
    let rows: Vec<Vec<String>> = sinks
        .iter()
        .map(|s| {
            let lag = s.lag.as_ref().map_or(0, |d| d.seconds);
            let state = if s.paused {
                "PAUSED".to_owned()
            } else {
                match s.failing_since.as_ref().and_then(crate::json::utc) {
                    Some(since) => format!("failing for {}", span(now - since)),
                    None => "delivering".to_owned(),
                }
            };
            vec![
                s.name.clone(),
                s.delivered_through.to_string(),
                span(chrono::TimeDelta::seconds(lag)),
                state,
                if s.last_error.is_empty() {
                    "-".to_owned()
                } else {
                    s.last_error.clone()
                },
            ]
        })
        .collect();
    table(&["SINK", "DELIVERED", "LAG", "STATE", "LAST ERROR"], &rows)
}

/// The one-line status `watch` redraws (a QUEUED reservation waits for an offer; it has no
/// hold to expire).
pub(crate) fn watch_line(r: &proto::Reservation, now: DateTime<Utc>) -> String {
    let time = if r.state() == State::Queued {
        "waiting for an offer".to_owned()
    } else {
        format!("expires in {}", expires_in(r, now))
    };
    format!(
        "{}  {}  {time}  branches {}",
        r.id,
        r.state().as_str_name(),
        branch_counts(r)
    )
}

/// Where a QUEUED reservation waits: `position 2 in seats/A1` (and the slot, if any).
fn queue_place(q: &proto::QueuePlace) -> String {
    let mut place = format!(
        "position {} in {}/{}",
        q.position, q.participant, q.resource
    );
    if let Some(d) = &q.during {
        place.push_str(&format!(
            " during {} - {}",
            at(d.start.as_ref()),
            at(d.end.as_ref())
        ));
    }
    place
}

/// An instant a wait ends, and how far off it is: `2026-12-06 11:00:00 UTC (in 59m58s)`.
pub(crate) fn until(t: Option<&prost_types::Timestamp>, now: DateTime<Utc>) -> String {
    match t.and_then(utc) {
        Some(t) if t > now => format!("{} (in {})", utc_text(t), span(t - now)),
        Some(t) => format!("{} (passed)", utc_text(t)),
        None => "-".to_owned(),
    }
}

pub(crate) fn at(t: Option<&prost_types::Timestamp>) -> String {
    t.and_then(utc)
        .map(utc_text)
        .unwrap_or_else(|| "-".to_owned())
}

fn utc_text(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn age(r: &proto::Reservation, now: DateTime<Utc>) -> String {
    r.created_at
        .as_ref()
        .and_then(utc)
        .map(|t| span(now - t))
        .unwrap_or_else(|| "-".to_owned())
}

/// Time left for a reservation that can still lapse; `-` once its outcome is decided.
pub(crate) fn expires_in(r: &proto::Reservation, now: DateTime<Utc>) -> String {
    if !matches!(r.state(), State::Trying | State::Held) {
        return "-".to_owned();
    }
    match r.expires_at.as_ref().and_then(utc) {
        Some(t) if t > now => span(t - now),
        Some(t) => format!("lapsed {} ago", span(now - t)),
        None => "-".to_owned(),
    }
}

fn branch_counts(r: &proto::Reservation) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for b in &r.branches {
        let name = b.state().as_str_name();
        match counts.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => *c += 1,
            None => counts.push((name, 1)),
        }
    }
    let parts: Vec<String> = counts.iter().map(|(n, c)| format!("{c} {n}")).collect();
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(", ")
    }
}

fn last_error(r: &proto::Reservation) -> String {
    let Some(b) = r.branches.iter().find(|b| !b.last_error.is_empty()) else {
        return String::new();
    };
    let text = format!("{}: {}", b.participant, b.last_error);
    if text.chars().count() > 60 {
        let cut: String = text.chars().take(59).collect();
        format!("{cut}…")
    } else {
        text
    }
}

/// A span such as `4m08s`, `1h02m`, `3d04h`, `12s` (never negative).
pub fn span(d: chrono::TimeDelta) -> String {
    let s = d.num_seconds().max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_on_the_widest_cell() {
        let t = table(
            &["A", "BB"],
            &[
                vec!["xxx".into(), "1".into()],
                vec!["y".into(), "22".into()],
            ],
        );
        assert_eq!(t, "A    BB\nxxx  1\ny    22\n");
    }

    #[test]
    fn spans_read_like_a_clock() {
        let s = chrono::TimeDelta::seconds;
        assert_eq!(span(s(0)), "0s");
        assert_eq!(span(s(59)), "59s");
        assert_eq!(span(s(248)), "4m08s");
        assert_eq!(span(s(3720)), "1h02m");
        assert_eq!(span(s(3 * 86400 + 4 * 3600)), "3d04h");
        assert_eq!(span(s(-5)), "0s");
    }

    #[test]
    fn a_queued_reservation_shows_where_it_waits() {
        let t = |seconds| prost_types::Timestamp { seconds, nanos: 0 };
        let r = proto::Reservation {
            id: "r1".into(),
            state: State::Queued as i32,
            expires_at: Some(t(1_796_000_600)),
            queue: Some(proto::QueuePlace {
                position: 3,
                participant: "rooms".into(),
                resource: "r-7".into(),
                during: Some(proto::Interval {
                    start: Some(t(1_796_119_200)),
                    end: Some(t(1_796_122_800)),
                }),
                since: Some(t(1_796_000_000)),
                until: Some(t(1_796_003_600)),
            }),
            ..Default::default()
        };
        let now = DateTime::from_timestamp(1_796_000_010, 0).unwrap();
        let page = reservation(&r, now);
        assert!(
            page.contains("expires     - (queued: nothing is held)\n"),
            "{page}"
        );
        assert!(
            page.contains(
                "queued      position 3 in rooms/r-7 during 2026-12-01 10:00:00 UTC - 2026-12-01 11:00:00 UTC\n\
                 waits until 2026-11-30 01:53:20 UTC (in 59m50s)\n"
            ),
            "{page}"
        );
        assert_eq!(
            watch_line(&r, now),
            "r1  QUEUED  waiting for an offer  branches -"
        );
        let later = DateTime::from_timestamp(1_796_003_601, 0).unwrap();
        assert_eq!(
            until(r.queue.as_ref().and_then(|q| q.until.as_ref()), later),
            "2026-11-30 01:53:20 UTC (passed)"
        );
    }

    #[test]
    fn a_reservation_shows_its_payments() {
        use proto::reservation::PaymentRecord;
        use proto::reservation::payment_record::State;
        let r = proto::Reservation {
            payments: vec![
                PaymentRecord {
                    participant: "payments".into(),
                    payment_ref: "pay-1".into(),
                    amount_minor: 4_200,
                    currency: "EUR".into(),
                    state: State::Applied as i32,
                    refund_id: String::new(),
                },
                PaymentRecord {
                    participant: "payments".into(),
                    payment_ref: "pay-2".into(),
                    amount_minor: 1_500,
                    currency: "EUR".into(),
                    state: State::RefundPending as i32,
                    refund_id: "f0".into(),
                },
            ],
            ..Default::default()
        };
        let out = reservation(&r, Utc::now());
        assert!(
            out.contains(
                "PAYMENTS  PAYMENT REF  AMOUNT    STATE           REFUND\n\
                 payments  pay-1        4200 EUR  APPLIED         \n\
                 payments  pay-2        1500 EUR  REFUND_PENDING  f0\n"
            ),
            "{out}"
        );
        let none = reservation(&proto::Reservation::default(), Utc::now());
        assert!(!none.contains("PAYMENTS"), "{none}");
    }
}
