//! What a run found: a row per case (case, expected, got, result), printed as a table for
//! people or as one JSON object (`--json`) for CI.

use serde_json::{Value, json};

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

    /// The table for people: one line per case, the notes and a summary below.
    pub fn table(&self) -> String {
        let header = ("CASE", "EXPECTED", "GOT", "RESULT");
        let w_case = self
            .rows
            .iter()
            .map(|r| r.case.len())
            .chain([header.0.len()])
            .max()
            .unwrap_or(0);
        let w_expected = self
            .rows
            .iter()
            .map(|r| r.expected.len())
            .chain([header.1.len()])
            .max()
            .unwrap_or(0);
        let w_got = self
            .rows
            .iter()
            .map(|r| r.got.len())
            .chain([header.2.len()])
            .max()
            .unwrap_or(0);
        let mut out = format!(
            "participant-check of {} (resource {:?})\n\n",
            self.participant, self.resource
        );
        let mut line = |a: &str, b: &str, c: &str, d: &str| {
            out.push_str(&format!(
                "{a:<w_case$}  {b:<w_expected$}  {c:<w_got$}  {d}\n"
            ));
        };
        line(header.0, header.1, header.2, header.3);
        for r in &self.rows {
            line(r.case, r.expected, &r.got, r.verdict.as_str());
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
    pub fn to_json(&self) -> Value {
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
