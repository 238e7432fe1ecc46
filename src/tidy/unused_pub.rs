//! `pub(crate)` by default, checked: the `pub` items of each workspace library that nothing
//! outside it names (no other crate, none of its binaries, `tests/`, `examples/` or
//! `benches/`). Those known today are listed in `unused_pub.txt`; a new one fails the check, and
//! so does a listed one that is now used or gone, so the list only shrinks.
//!
//! Matching is by name, so an item is "used" when anything outside names the same identifier:
//! the check misses some unused items (a `pub fn new` is always named somewhere) but never calls
//! a used one unused. `HOLDFAST_TIDY_BLESS=1 cargo test --lib tidy` rewrites the list (after a
//! crate moved or split, say).

use std::collections::BTreeSet;
use std::path::Path;

use super::workspace::{self, Member, is_test};

/// The checked-in list, one `path/below/src.rs kind Name` a line.
const BASELINE: &str = include_str!("unused_pub.txt");

/// One public item: where (below its crate's `src/`), what and its name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct PubItem {
    pub(super) in_src: String,
    pub(super) kind: &'static str,
    pub(super) name: String,
}

impl PubItem {
    fn line(&self) -> String {
        format!("{} {} {}", self.in_src, self.kind, self.name)
    }
}

/// The `pub` (not `pub(crate)`, not `pub(super)`) items a file declares outside test code:
/// free items, and the `pub` functions and constants of inherent impls.
pub(super) fn pub_items(in_src: &str, items: &[syn::Item], out: &mut Vec<PubItem>) {
    let public = |v: &syn::Visibility| matches!(v, syn::Visibility::Public(_));
    let mut add = |kind: &'static str, name: &syn::Ident| {
        let name = name.to_string();
        out.push(PubItem {
            in_src: in_src.to_owned(),
            kind,
            name: name.strip_prefix("r#").unwrap_or(&name).to_owned(),
        });
    };
    let mut inline = Vec::new();
    for item in items {
        match item {
            syn::Item::Fn(i) if public(&i.vis) && !is_test(&i.attrs) => add("fn", &i.sig.ident),
            syn::Item::Struct(i) if public(&i.vis) => add("struct", &i.ident),
            syn::Item::Enum(i) if public(&i.vis) => add("enum", &i.ident),
            syn::Item::Trait(i) if public(&i.vis) => add("trait", &i.ident),
            syn::Item::Const(i) if public(&i.vis) => add("const", &i.ident),
            syn::Item::Static(i) if public(&i.vis) => add("static", &i.ident),
            syn::Item::Type(i) if public(&i.vis) => add("type", &i.ident),
            syn::Item::Union(i) if public(&i.vis) => add("union", &i.ident),
            syn::Item::Impl(i) if i.trait_.is_none() && !is_test(&i.attrs) => {
                for member in &i.items {
                    match member {
                        syn::ImplItem::Fn(f) if public(&f.vis) && !is_test(&f.attrs) => {
                            add("fn", &f.sig.ident)
                        }
                        syn::ImplItem::Const(c) if public(&c.vis) => add("const", &c.ident),
                        _ => {}
                    }
                }
            }
            syn::Item::Mod(m) if !is_test(&m.attrs) => {
                if let Some((_, inner)) = &m.content {
                    inline.push(inner);
                }
            }
            _ => {}
        }
    }
    for inner in inline {
        pub_items(in_src, inner, out);
    }
}

/// Every workspace library's `pub` items no one outside it names.
fn unused() -> Result<Vec<PubItem>, String> {
    let members = workspace::members();
    let mut unused = Vec::new();
    for member in &members {
        let modules = workspace::modules(member)?;
        let mut items = Vec::new();
        for m in modules.iter().filter(|m| !m.test && !m.bin) {
            pub_items(&m.in_src, &m.ast.items, &mut items);
        }
        let named = named_outside(member, &members);
        unused.extend(items.into_iter().filter(|i| !named.contains(&i.name)));
    }
    unused.sort();
    unused.dedup();
    Ok(unused)
}

/// The identifiers named outside `member`'s library: every other member's files, and its own
/// binaries, tests, examples and benches.
fn named_outside(member: &Member, members: &[Member]) -> BTreeSet<String> {
    let mut files = Vec::new();
    for other in members {
        if other.dir == member.dir {
            let src = member.dir.join("src");
            files.extend(workspace::rs_files(&src.join("bin")));
            files.push(src.join("main.rs"));
            for dir in ["tests", "examples", "benches"] {
                files.extend(workspace::rs_files(&member.dir.join(dir)));
            }
        } else {
            // A member inside another's directory (the root crate's `crates/`) is its own.
            files.extend(
                workspace::rs_files(&other.dir)
                    .into_iter()
                    .filter(|f| owner(f, members).is_some_and(|o| o.dir == other.dir)),
            );
        }
    }
    let mut named = BTreeSet::new();
    for file in files {
        if let Ok(text) = std::fs::read_to_string(&file) {
            workspace::idents(&text, &mut named);
        }
    }
    named
}

/// The member a file belongs to: the one with the deepest directory above it.
fn owner<'a>(file: &Path, members: &'a [Member]) -> Option<&'a Member> {
    members
        .iter()
        .filter(|m| file.starts_with(&m.dir) && !file.starts_with(m.dir.join("target")))
        .max_by_key(|m| m.dir.components().count())
}

#[test]
fn no_new_public_item_is_unused_outside_its_crate() {
    let found = match unused() {
        Ok(found) => found,
        Err(e) => panic!("sources tidy cannot read: {e}"),
    };
    let lines: BTreeSet<String> = found.iter().map(PubItem::line).collect();
    if std::env::var_os("HOLDFAST_TIDY_BLESS").is_some() {
        let path = workspace::root()
            .join(file!())
            .with_file_name("unused_pub.txt");
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        if let Err(e) = std::fs::write(&path, text) {
            panic!("writing {}: {e}", path.display());
        }
        return;
    }
    let listed: BTreeSet<String> = BASELINE
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    let new: Vec<&String> = lines.difference(&listed).collect();
    let gone: Vec<&String> = listed.difference(&lines).collect();
    assert!(
        new.is_empty(),
        "public items no other crate, test or example names: make them pub(crate) (or use them):\n{}",
        new.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        gone.is_empty(),
        "src/tidy/unused_pub.txt lists items that are used now or gone: drop those lines \
         (HOLDFAST_TIDY_BLESS=1 cargo test --lib tidy rewrites the list):\n{}",
        gone.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn public_means_pub_outside_tests() {
    let text = "pub fn a() {}\npub(crate) fn b() {}\npub struct C;\nimpl C { pub fn d(&self) {} fn e() {} }\n\
                impl Default for C { fn default() -> C { C } }\nmod m { pub const F: u8 = 1; }\n\
                #[cfg(test)]\nmod tests { pub fn g() {} }\n";
    let file = syn::parse_file(text).expect("test source parses");
    let mut items = Vec::new();
    pub_items("x.rs", &file.items, &mut items);
    let names: Vec<&str> = items.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["a", "C", "d", "F"]);

    let mut named = BTreeSet::new();
    workspace::idents("use x::a; // d\nlet s = \"F\"; f!(r#C);", &mut named);
    assert!(named.contains("a") && named.contains("C") && named.contains("f"));
    assert!(!named.contains("d") && !named.contains("F"));
}
