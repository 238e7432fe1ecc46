//! `--help` in plain text. The help of every flag and command is its doc comment, written for
//! rustdoc as well: backticks, `[links](...)` and `[`paths`]`, and citations of the SPEC
//! sections a developer checks them against. [`plain_help`] rewrites every help text of a
//! command tree for the people who run the binary: the markup goes, the text stays, and
//! a `(SPEC 7.2)`-style citation goes with its parentheses.

use clap::Command;
use clap::builder::StyledStr;

/// `command` and every subcommand below it with their help texts in plain text.
pub fn plain_help(command: Command) -> Command {
    let command = match command.get_about().map(|t| plain(&t.to_string())) {
        Some(about) => command.about(about),
        None => command,
    };
    let command = match command.get_long_about().map(|t| plain(&t.to_string())) {
        Some(about) => command.long_about(about),
        None => command,
    };
    command
        .mut_args(|arg| {
            let help = arg.get_help().map(|t| plain(&t.to_string()));
            let long = arg.get_long_help().map(|t| plain(&t.to_string()));
            let arg = match help {
                Some(h) => arg.help(h),
                None => arg,
            };
            match long {
                Some(h) => arg.long_help(h),
                None => arg,
            }
        })
        .mut_subcommands(plain_help)
}

/// One help text without rustdoc markup or SPEC citations.
fn plain(text: &str) -> StyledStr {
    let text = drop_citations(text);
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match link(after) {
            Some((shown, used)) => {
                out.push_str(shown);
                rest = &after[used..];
            }
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.replace('`', "").into()
}

/// A link after its `[`: `text](target)` or `` `path`] `` (rustdoc's intra-doc link); what
/// it shows and how many bytes it spans. Other brackets (a TOML `[[principal]]`) are text.
fn link(after: &str) -> Option<(&str, usize)> {
    let close = after.find(']')?;
    let shown = &after[..close];
    if shown.contains('[') || shown.contains('\n') {
        return None;
    }
    let tail = &after[close + 1..];
    if tail.starts_with('(') {
        let end = tail.find(')')?;
        return Some((shown, close + 1 + end + 1));
    }
    (shown.starts_with('`') && shown.ends_with('`') && shown.len() > 1)
        .then(|| (&shown[1..shown.len() - 1], close + 1))
}

/// The text without `(SPEC 8.2)`-style citations (and the space before one), and with a
/// citation inside parentheses (`(..., SPEC 7.4)`, `(SPEC 3.2: ...)`) cut out of them. A
/// citation in a sentence ("against SPEC 3.3") is left: it is reworded at its source (the
/// `--help` test finds it).
fn drop_citations(text: &str) -> String {
    let mut out = text.to_owned();
    let mut from = 0;
    while let Some(found) = out[from..].find("SPEC ") {
        let at = from + found;
        let digits = out[at + 5..]
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .map_or(out.len(), |i| at + 5 + i);
        let number_end = if out[..digits].ends_with('.') {
            digits - 1
        } else {
            digits
        };
        let (before, after) = (&out[..at], &out[number_end..]);
        let cut = if before.ends_with('(') && after.starts_with(')') {
            let open = at - 1;
            let start = if out[..open].ends_with(' ') {
                open - 1
            } else {
                open
            };
            Some((start, number_end + 1))
        } else if before.ends_with('(') && (after.starts_with(": ") || after.starts_with(", ")) {
            Some((at, number_end + 2))
        } else if (before.ends_with(", ") || before.ends_with("; "))
            && (after.starts_with(')') || after.starts_with(';') || after.starts_with(','))
        {
            Some((at - 2, number_end))
        } else {
            None
        };
        match cut {
            Some((start, end)) => {
                out.replace_range(start..end, "");
                from = start;
            }
            None => from = at + 5,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_and_citations_go_the_words_stay() {
        for (doc, shown) in [
            (
                "API key presented as `authorization: Bearer <key>` (SPEC 7.2).",
                "API key presented as authorization: Bearer <key>.",
            ),
            (
                "As the [`crate::json::error`] shape, see [the README](README.md).",
                "As the crate::json::error shape, see the README.",
            ),
            (
                "The command line: get, list (SPEC 8.2).",
                "The command line: get, list.",
            ),
            (
                "Where it listens (the console, SPEC 8.4), or off.",
                "Where it listens (the console), or off.",
            ),
            (
                "Refused (SPEC 3.2: INVALID_ARGUMENT) at once.",
                "Refused (INVALID_ARGUMENT) at once.",
            ),
            (
                "The [[principal]] entry for --auth-keys, [x] and [y].",
                "The [[principal]] entry for --auth-keys, [x] and [y].",
            ),
        ] {
            assert_eq!(plain(doc).to_string(), shown, "{doc}");
        }
    }
}
