//! Finding reservations by what a person has in hand: the first characters of an id (the
//! console's search box, `holdfast get 01a23eb5`) or a Reserve request id. A lookup replaces
//! List's filters; each is one indexed read: an id prefix is a range of the primary key (no
//! `LIKE`, so no wildcard to escape), a request id an equality on its index (migration `0014`).

use uuid::Uuid;

use super::validate::FieldError;

/// The fewest hex digits an id prefix may have: fewer would match a large share of the table.
pub(crate) const MIN_PREFIX_DIGITS: usize = 4;

/// A lookup that List answers instead of its filters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Find {
    /// Every id that starts with a prefix: from `low` to `high`, both included, in id order.
    Ids { low: Uuid, high: Uuid },
    /// The reservations made with this Reserve request id, any holder, newest first.
    RequestId(String),
}

impl Find {
    /// The range of ids starting with `prefix`: hex digits (either case), dashes anywhere
    /// (as a copied id has them), at least [`MIN_PREFIX_DIGITS`] and at most 32 digits.
    pub fn id_prefix(field: &str, prefix: &str) -> Result<Find, FieldError> {
        let mut digits = String::with_capacity(32);
        for c in prefix.chars() {
            match c {
                '-' => {}
                c if c.is_ascii_hexdigit() => digits.push(c.to_ascii_lowercase()),
                other => {
                    return Err(FieldError::new(
                        field,
                        format!("must be hex digits of a reservation id (found {other:?})"),
                    ));
                }
            }
        }
        if digits.len() < MIN_PREFIX_DIGITS || digits.len() > 32 {
            return Err(FieldError::new(
                field,
                format!(
                    "must have {MIN_PREFIX_DIGITS} to 32 hex digits (got {})",
                    digits.len()
                ),
            ));
        }
        let pad = |fill: char| {
            let mut full = digits.clone();
            full.extend(std::iter::repeat_n(fill, 32 - digits.len()));
            u128::from_str_radix(&full, 16).map(Uuid::from_u128)
        };
        match (pad('0'), pad('f')) {
            (Ok(low), Ok(high)) => Ok(Find::Ids { low, high }),
            _ => Err(FieldError::new(
                field,
                "must be hex digits of a reservation id",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_is_the_range_of_ids_that_start_with_it() {
        let id: Uuid = "01a23eb5-7c1d-7e00-8a00-0123456789ab".parse().unwrap();
        for prefix in [
            "01a23eb5",
            "01A23EB5-7c",
            "01a2",
            &id.to_string(),
            &id.simple().to_string(),
        ] {
            let Find::Ids { low, high } = Find::id_prefix("id_prefix", prefix).unwrap() else {
                panic!("a range");
            };
            assert!(low <= id && id <= high, "{prefix}: {low}..{high}");
        }
        let Find::Ids { low, high } = Find::id_prefix("id_prefix", "01a23eb5").unwrap() else {
            panic!("a range");
        };
        assert_eq!(low.to_string(), "01a23eb5-0000-0000-0000-000000000000");
        assert_eq!(high.to_string(), "01a23eb5-ffff-ffff-ffff-ffffffffffff");
        let next: Uuid = "01a23eb6-0000-0000-0000-000000000000".parse().unwrap();
        assert!(next > high);
        assert_eq!(
            Find::id_prefix("id_prefix", &id.to_string()).unwrap(),
            Find::Ids { low: id, high: id }
        );
    }

    #[test]
    fn anything_but_hex_digits_is_refused_naming_the_field() {
        for bad in [
            "",
            "01a",
            "01a2%",
            "01a2_",
            "zz01a2",
            "01a23eb5-7c1d-7e00-8a00-0123456789abc",
        ] {
            let e = Find::id_prefix("id_prefix", bad).unwrap_err();
            assert_eq!(e.field, "id_prefix", "{bad}");
        }
    }
}
