//! Which statement answers a List, decided once for both databases.
//!
//! Every shape of [`ListQuery`] (whose reservations: everyone's or one owner's; one holder's
//! or all; which state) has a statement of its own, and each of them an index whose order is
//! the listing's (`created_at DESC, id DESC` after the equality columns, migration `0006`), so
//! even a generic (cached) plan walks exactly the page: no `($1 IS NULL OR col = $1)`
//! catch-all, which no index can serve. Paging is keyset: every statement lists strictly
//! before a cursor, the first page before [`first_cursor`].
//!
//! The state as read includes lazy expiry: `HELD` past `expires_at` reads `EXPIRED`. So
//! `HELD` lists stored `HELD` rows not past their time ([`StateFilter::Live`]), and `EXPIRED`
//! lists stored `EXPIRED` rows merged with lapsed `HELD` ones ([`StateFilter::Lapsed`]: two
//! index walks, merged in order); every other state is the stored one.

use chrono::{DateTime, TimeZone, Utc};
use uuid::Uuid;

use crate::domain::{ListQuery, Reservation, State};

/// How a List filters by state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateFilter {
    /// No state filter.
    Any,
    /// The stored state is the one asked for (neither `HELD` nor `EXPIRED`).
    Stored,
    /// `HELD` as read: stored `HELD`, not past `expires_at`.
    Live,
    /// `EXPIRED` as read: stored `EXPIRED`, or `HELD` past `expires_at`.
    Lapsed,
}

/// The shape of a List: which filters it has, so which statement answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListShape {
    pub owner: bool,
    pub holder: bool,
    pub state: StateFilter,
    /// Only reservations with a branch at a participant: a semi-join per row walked, one probe
    /// of `branches_by_participant` (migration `0008`) each.
    pub participant: bool,
    /// Only reservations carrying given labels: checked on each row walked.
    pub labels: bool,
}

impl ListShape {
    pub fn of(query: &ListQuery) -> ListShape {
        ListShape {
            owner: query.owner.is_some(),
            holder: query.holder.is_some(),
            state: match query.state {
                None => StateFilter::Any,
                Some(State::Held) => StateFilter::Live,
                Some(State::Expired) => StateFilter::Lapsed,
                Some(_) => StateFilter::Stored,
            },
            participant: query.participant.is_some(),
            labels: !query.labels.is_empty(),
        }
    }

    /// Every shape, for tests that check each one's plan.
    pub fn all() -> Vec<ListShape> {
        let mut shapes = Vec::new();
        for (participant, labels) in [(false, false), (true, false), (false, true), (true, true)] {
            for owner in [false, true] {
                for holder in [false, true] {
                    for state in [
                        StateFilter::Any,
                        StateFilter::Stored,
                        StateFilter::Live,
                        StateFilter::Lapsed,
                    ] {
                        shapes.push(ListShape {
                            owner,
                            holder,
                            state,
                            participant,
                            labels,
                        });
                    }
                }
            }
        }
        shapes
    }

    /// Index into a table of statements laid out as [`ListShape::all`] lists them.
    pub fn index(self) -> usize {
        let state = match self.state {
            StateFilter::Any => 0,
            StateFilter::Stored => 1,
            StateFilter::Live => 2,
            StateFilter::Lapsed => 3,
        };
        usize::from(self.labels) * 32
            + usize::from(self.participant) * 16
            + usize::from(self.owner) * 8
            + usize::from(self.holder) * 4
            + state
    }
}

/// The cursor of a first page: after every reservation (9999-12-31, the largest id).
pub(crate) fn first_cursor() -> (DateTime<Utc>, Uuid) {
    let end = Utc
        .with_ymd_and_hms(9999, 12, 31, 23, 59, 59)
        .single()
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    (end, Uuid::max())
}

/// Where a List starts: its cursor, or before everything; `created_before` is a cursor too
/// (before `(t, nil)` is before `t`: the nil UUID is the smallest), the earlier of the two.
pub fn cursor(query: &ListQuery) -> (DateTime<Utc>, Uuid) {
    let start = query.after.unwrap_or_else(first_cursor);
    match query.created_before {
        Some(t) if (t, Uuid::nil()) < start => (t, Uuid::nil()),
        _ => start,
    }
}

/// The ids an id-prefix lookup reads next: from the prefix's first id, or the id after the
/// cursor's, to its last; `None` once the cursor is at the end.
pub(crate) fn id_range(query: &ListQuery, low: Uuid, high: Uuid) -> Option<(Uuid, Uuid)> {
    let from = match query.after {
        None => low,
        Some((_, id)) => Uuid::from_u128(id.as_u128().checked_add(1)?).max(low),
    };
    (from <= high).then_some((from, high))
}

/// `created_after` on a page read newest first: the rows before it are the page's tail (and
/// every later page's), dropped here, so the walk stops at the page's limit as always.
pub fn created_after(query: &ListQuery, mut page: Vec<Reservation>) -> Vec<Reservation> {
    if let Some(t) = query.created_after {
        page.retain(|r| r.created_at >= t);
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_range_resumes_after_the_cursor_and_ends() {
        let (low, high) = (Uuid::from_u128(0x10), Uuid::from_u128(0x1f));
        let mut q = ListQuery::default();
        assert_eq!(id_range(&q, low, high), Some((low, high)));
        q.after = Some((first_cursor().0, Uuid::from_u128(0x12)));
        assert_eq!(id_range(&q, low, high), Some((Uuid::from_u128(0x13), high)));
        q.after = Some((first_cursor().0, high));
        assert_eq!(id_range(&q, low, high), None);
        q.after = Some((first_cursor().0, Uuid::max()));
        assert_eq!(id_range(&q, low, Uuid::max()), None);
    }

    #[test]
    fn every_shape_has_its_own_slot() {
        let all = ListShape::all();
        assert_eq!(all.len(), 64);
        for (i, s) in all.iter().enumerate() {
            assert_eq!(s.index(), i, "{s:?}");
        }
    }
}
