//! The console in a real browser (filled in below).
