//! Rounds of a run (`--rounds N`): a row of round `r` is named `<name>#<r>` when there are
//! several rounds, `<name>` when there is one.

/// What separates a row's name from its round.
const ROUND: char = '#';

/// Row `name` of `round` (`name#round`; just `name` when there is one round).
pub(super) fn in_round(name: String, round: u32, rounds: u32) -> String {
    if rounds > 1 {
        format!("{name}{ROUND}{round}")
    } else {
        name
    }
}

/// Row `name` without its round, and the round's suffix: (`throughput-noop-nats`, `#2`) of
/// `throughput-noop-nats#2`, (`throughput-noop`, ``) of `throughput-noop`.
pub(super) fn split_round(name: &str) -> (&str, &str) {
    match name.rfind(ROUND) {
        Some(at) => name.split_at(at),
        None => (name, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_and_its_round_part_again() {
        assert_eq!(in_round("throughput-noop".into(), 1, 1), "throughput-noop");
        assert_eq!(split_round("throughput-noop"), ("throughput-noop", ""));
        let named = in_round("throughput-noop-nats".into(), 2, 3);
        assert_eq!(named, "throughput-noop-nats#2");
        assert_eq!(split_round(&named), ("throughput-noop-nats", "#2"));
    }
}
