//! What a run found: a row per case (case, expected, got, result), printed as a table for
//! people or as one JSON object (`--json`) for CI.

use serde_json::{Value, json};

/// Where the table wraps its long cells (between steps, never inside one).
const EXPECTED_WIDTH: usize = 48;
const GOT_WIDTH: usize = 64;

/// `text` in lines of at most `width` bytes, broken after the commas between steps, and a
/// step longer than `width` between its words (a word longer than `width` stays whole).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for (i, part) in text.split(", ").enumerate() {
        let part = if i + 1 < text.split(", ").count() {
            format!("{part},")
        } else {
            part.to_owned()
        };
        let fits = |line: &str, more: &str| line.is_empty() || line.len() + 1 + more.len() <= width;
        if !fits(&line, &part) {
            lines.push(std::mem::take(&mut line));
        }
        if part.len() <= width {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(&part);
            continue;
        }
        for word in part.split(' ') {
            if !fits(&line, word) {
                lines.push(std::mem::take(&mut line));
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
    }
    lines.push(line);
    lines
}

/// How a case ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    /// The case cannot run against this participant (the row says why).
    Skipped,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "FAIL",
            Verdict::Skipped => "skipped",
        }
    }
}

/// One case's result.
#[derive(Clone, Debug)]
pub struct Row {
    pub case: &'static str,
    pub expected: &'static str,
    /// What the participant answered, step by step (the wrong answer last on a failure), or
    /// why the case was skipped.
    pub got: String,
    pub verdict: Verdict,
}

/// A whole run.
#[derive(Clone, Debug)]
pub struct Report {
    pub participant: String,
    pub resource: String,
    /// What the run found out about the participant (what it offers, what is not checked).
    pub notes: Vec<String>,
    pub rows: Vec<Row>,
}

impl Report {
    /// How many cases ended `verdict`.
    pub fn count(&self, verdict: Verdict) -> usize {
        self.rows.iter().filter(|r| r.verdict == verdict).count()
    }

    /// The failed cases' names.
    pub fn failed(&self) -> Vec<&'static str> {
        self.rows
            .iter()
            .filter(|r| r.verdict == Verdict::Fail)
            .map(|r| r.case)
            .collect()
    }

    /// The table for people: a row per case (long cells wrapped between steps), then the
    /// notes and a summary.
    pub fn table(&self) -> String {
        let header = ["CASE", "EXPECTED", "GOT", "RESULT"];
        let cells: Vec<[Vec<String>; 4]> = std::iter::once(header.map(|h| vec![h.to_owned()]))
            .chain(self.rows.iter().map(|r| {
                [
                    vec![r.case.to_owned()],
                    wrap(r.expected, EXPECTED_WIDTH),
                    wrap(&r.got, GOT_WIDTH),
                    vec![r.verdict.as_str().to_owned()],
                ]
            }))
            .collect();
        let width = |col: usize| {
            cells
                .iter()
                .flat_map(|row| row[col].iter().map(String::len))
                .max()
                .unwrap_or(0)
        };
        let (w0, w1, w2) = (width(0), width(1), width(2));
        let mut out = format!(
            "participant-check of {} (resource {:?})\n\n",
            self.participant, self.resource
        );
        for row in &cells {
            let lines = row.iter().map(Vec::len).max().unwrap_or(1);
            for i in 0..lines {
                let cell = |col: usize| row[col].get(i).map_or("", String::as_str);
                let line = format!(
                    "{:<w0$}  {:<w1$}  {:<w2$}  {}",
                    cell(0),
                    cell(1),
                    cell(2),
                    cell(3)
                );
                out.push_str(line.trim_end());
                out.push('\n');
            }
        }
        for note in &self.notes {
            out.push_str(&format!("\nnote: {note}"));
        }
        out.push_str(&format!(
            "\n\n{} passed, {} failed, {} skipped\n",
            self.count(Verdict::Pass),
            self.count(Verdict::Fail),
            self.count(Verdict::Skipped)
        ));
        out
    }

    /// The report as one JSON object.
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "participant": self.participant,
            "resource": self.resource,
            "passed": self.count(Verdict::Pass),
            "failed": self.count(Verdict::Fail),
            "skipped": self.count(Verdict::Skipped),
            "notes": self.notes,
            "cases": self.rows.iter().map(|r| json!({
                "case": r.case,
                "expected": r.expected,
                "got": r.got,
                "result": match r.verdict {
                    Verdict::Pass => "pass",
                    Verdict::Fail => "fail",
                    Verdict::Skipped => "skipped",
                },
            })).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::wrap;

    #[test]
    fn long_cells_wrap_between_steps() {
        assert_eq!(wrap("a b, c, dd", 4), ["a b,", "c,", "dd"]);
        assert_eq!(wrap("a, b", 10), ["a, b"]);
        assert_eq!(wrap("", 10), [""]);
        // A step longer than the width breaks between words; a long word stays whole.
        assert_eq!(wrap("x, one two three", 8), ["x,", "one two", "three"]);
        assert_eq!(wrap("abcdefghij", 4), ["abcdefghij"]);
    }
}
