//! No function body longer than a screen: [`MAX_BODY_LINES`] in every crate's `src/`, tests
//! aside, but for the functions of [`ALLOWED`], each with its reason.

use syn::visit::{self, Visit};

use super::workspace::{self, is_test};

/// The most lines a function's body (its braces included) may span.
pub(super) const MAX_BODY_LINES: usize = 80;

/// Functions allowed a longer body: (file below its crate's `src/`, function name, why).
/// An entry that no longer matches a long function fails the check, so the list only shrinks.
const ALLOWED: &[(&str, &str, &str)] = &[(
    "api/error.rs",
    "from",
    "the one error-mapping match: one arm per domain error, read as a table",
)];

/// A function whose body is longer than the limit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Long {
    pub(super) in_src: String,
    pub(super) name: String,
    pub(super) line: usize,
    pub(super) lines: usize,
}

/// The long functions of a parsed file, test functions and `#[cfg(test)]` code aside.
pub(super) fn long_fns(in_src: &str, file: &syn::File) -> Vec<Long> {
    let mut finder = Finder {
        in_src,
        found: Vec::new(),
    };
    finder.visit_file(file);
    finder.found
}

struct Finder<'a> {
    in_src: &'a str,
    found: Vec<Long>,
}

impl Finder<'_> {
    fn body(&mut self, name: &syn::Ident, block: &syn::Block) {
        let open = block.brace_token.span.open().start().line;
        let close = block.brace_token.span.close().end().line;
        let lines = close.saturating_sub(open) + 1;
        if lines > MAX_BODY_LINES {
            self.found.push(Long {
                in_src: self.in_src.to_owned(),
                name: name.to_string(),
                line: name.span().start().line,
                lines,
            });
        }
    }
}

impl<'ast> Visit<'ast> for Finder<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test(&f.attrs) {
            self.body(&f.sig.ident, &f.block);
            visit::visit_item_fn(self, f);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test(&f.attrs) {
            self.body(&f.sig.ident, &f.block);
            visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.body(&f.sig.ident, block);
        }
        visit::visit_trait_item_fn(self, f);
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if !is_test(&i.attrs) {
            visit::visit_item_impl(self, i);
        }
    }
}

#[test]
fn no_function_is_longer_than_a_screen() {
    let mut long = Vec::new();
    let mut broken = Vec::new();
    for member in workspace::members() {
        match workspace::modules(&member) {
            Ok(modules) => {
                for m in modules.iter().filter(|m| !m.test) {
                    long.extend(long_fns(&m.in_src, &m.ast));
                }
            }
            Err(e) => broken.push(format!("{}: {e}", member.name)),
        }
    }
    assert!(
        broken.is_empty(),
        "sources tidy cannot read:\n{}",
        broken.join("\n")
    );
    let allowed = |l: &Long| {
        ALLOWED
            .iter()
            .any(|(f, n, _)| *f == l.in_src && *n == l.name)
    };
    let over: Vec<String> = long
        .iter()
        .filter(|l| !allowed(l))
        .map(|l| format!("{}:{} fn {}: {} lines", l.in_src, l.line, l.name, l.lines))
        .collect();
    let stale: Vec<String> = ALLOWED
        .iter()
        .filter(|(f, n, _)| !long.iter().any(|l| l.in_src == *f && l.name == *n))
        .map(|(f, n, _)| format!("{f} fn {n}"))
        .collect();
    assert!(
        over.is_empty(),
        "function bodies over {MAX_BODY_LINES} lines (split them by step, or allow-list one with \
         its reason in src/tidy/fn_length.rs):\n{}",
        over.join("\n")
    );
    assert!(
        stale.is_empty(),
        "allowed long functions that are no longer long (drop them from ALLOWED):\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_length_is_the_body_read_as_rust() {
    let body: String = (0..MAX_BODY_LINES - 2)
        .map(|i| format!("    let _x{i} = \"}}\";\n"))
        .collect();
    let fits = format!("fn fits() {{\n{body}}}\n");
    let file = syn::parse_file(&fits).expect("test source parses");
    assert!(
        long_fns("a.rs", &file).is_empty(),
        "a body of exactly the limit fits"
    );

    let longer = format!(
        "struct S;\nimpl S {{\n    fn long(&self) {{\n{body}    let _y = 1;\n}}\n}}\n\
         #[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{body}    let _y = 1;\n}}\n}}\n"
    );
    let file = syn::parse_file(&longer).expect("test source parses");
    let found = long_fns("a.rs", &file);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].name.as_str(), found[0].lines),
        ("long", MAX_BODY_LINES + 1)
    );
}
