//! The error of one malformed or out-of-bounds request field, naming it: what every
//! validation rule (`validate`, `waitlist`) answers.

use std::fmt;

/// A malformed or out-of-bounds field. Displays as `<field> <problem>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub problem: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> FieldError {
        FieldError {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.field, self.problem)
    }
}

impl std::error::Error for FieldError {}
