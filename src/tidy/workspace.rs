//! The workspace as the tidy checks see it: its members (read from the root `Cargo.toml`, not
//! spelled here, so crates can move), and each member's source files in its module tree, parsed
//! with `syn` and marked test-only when a `#[cfg(test)]` module brings them in.

use std::path::{Path, PathBuf};
use std::str::FromStr;

/// One crate of the workspace.
pub(super) struct Member {
    /// The package name.
    pub(super) name: String,
    /// Its directory.
    pub(super) dir: PathBuf,
}

/// One source file of a member's `src/`, reached from `lib.rs`, `main.rs` or `bin/`.
pub(super) struct Module {
    /// The path below the member's `src/` (`api/error.rs`): the key of allow-lists, which a
    /// crate's files keep when the crate moves.
    pub(super) in_src: String,
    /// Brought in by a `#[cfg(test)]` module (or a file of one).
    pub(super) test: bool,
    /// Part of a binary target rather than the library.
    pub(super) bin: bool,
    pub(super) ast: syn::File,
}

/// The workspace root: the nearest directory above this crate whose `Cargo.toml` has a
/// `[workspace]` table.
pub(super) fn root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|dir| manifest(dir).is_some_and(|m| m.contains_key("workspace")))
        .unwrap_or(here)
        .to_path_buf()
}

fn manifest(dir: &Path) -> Option<toml::Table> {
    let text = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
    toml::Table::from_str(&text).ok()
}

/// The workspace's members, from `workspace.members` (a trailing `/*` is expanded).
pub(super) fn members() -> Vec<Member> {
    let root = root();
    let Some(manifest_root) = manifest(&root) else {
        return Vec::new();
    };
    let listed = manifest_root
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(|m| m.as_array())
        .cloned()
        .unwrap_or_default();
    let mut dirs = Vec::new();
    for entry in listed.iter().filter_map(|m| m.as_str()) {
        match entry.strip_suffix("/*") {
            Some(parent) => {
                let mut found: Vec<PathBuf> = std::fs::read_dir(root.join(parent))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.join("Cargo.toml").is_file())
                    .collect();
                found.sort();
                dirs.extend(found);
            }
            None => dirs.push(root.join(entry)),
        }
    }
    dirs.into_iter()
        .filter_map(|dir| {
            let m = manifest(&dir)?;
            let name = m.get("package")?.get("name")?.as_str()?.to_owned();
            Some(Member { name, dir })
        })
        .collect()
}

/// Every `.rs` file below `dir`, sorted.
pub(super) fn rs_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    collect(dir, &mut out);
    out.sort();
    out
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A member's module tree: its library from `src/lib.rs`, its binaries from `src/main.rs` and
/// `src/bin/`. A file that does not parse is an error naming it.
pub(super) fn modules(member: &Member) -> Result<Vec<Module>, String> {
    let src = member.dir.join("src");
    let mut roots = vec![(src.join("lib.rs"), false), (src.join("main.rs"), true)];
    roots.extend(rs_files(&src.join("bin")).into_iter().map(|p| (p, true)));
    let mut out = Vec::new();
    for (file, bin) in roots.into_iter().filter(|(p, _)| p.is_file()) {
        let dir = file.parent().unwrap_or(&src).to_path_buf();
        let walk = Walk { src: &src, bin };
        walk.file(&file, &dir, false, &mut out)?;
    }
    Ok(out)
}

struct Walk<'a> {
    src: &'a Path,
    bin: bool,
}

impl Walk<'_> {
    /// Parses `file` and follows its `mod x;` declarations; `dir` is where they live.
    fn file(
        &self,
        file: &Path,
        dir: &Path,
        test: bool,
        out: &mut Vec<Module>,
    ) -> Result<(), String> {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let ast = syn::parse_file(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        self.items(&ast.items, dir, test, out)?;
        let in_src = file
            .strip_prefix(self.src)
            .unwrap_or(file)
            .to_string_lossy()
            .replace('\\', "/");
        out.push(Module {
            in_src,
            test,
            bin: self.bin,
            ast,
        });
        Ok(())
    }

    fn items(
        &self,
        items: &[syn::Item],
        dir: &Path,
        test: bool,
        out: &mut Vec<Module>,
    ) -> Result<(), String> {
        for item in items {
            let syn::Item::Mod(m) = item else { continue };
            let test = test || is_test(&m.attrs);
            let name = m.ident.to_string();
            match &m.content {
                Some((_, inner)) => self.items(inner, &dir.join(&name), test, out)?,
                None => {
                    let file = match path_attr(&m.attrs) {
                        Some(p) => dir.join(p),
                        None if dir.join(format!("{name}.rs")).is_file() => {
                            dir.join(format!("{name}.rs"))
                        }
                        None => dir.join(&name).join("mod.rs"),
                    };
                    let below = if file.file_name().is_some_and(|f| f == "mod.rs") {
                        file.parent().unwrap_or(dir).to_path_buf()
                    } else {
                        dir.join(&name)
                    };
                    if file.is_file() {
                        self.file(&file, &below, test, out)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// `#[cfg(test)]` (or a `cfg` naming `test` at all), or a test attribute (`#[test]`,
/// `#[tokio::test]`, `#[sqlx::test]`).
pub(super) fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let path = a.path();
        if path.is_ident("cfg") {
            let tokens = match &a.meta {
                syn::Meta::List(list) => list.tokens.to_string(),
                _ => String::new(),
            };
            tokens
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .any(|w| w == "test")
                && !tokens.contains("not")
        } else {
            path.segments.last().is_some_and(|s| s.ident == "test")
        }
    })
}

fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// Every identifier a file's code names, macro bodies included; comments and string literals
/// are not code. A file that does not lex gives nothing.
pub(super) fn idents(text: &str, out: &mut std::collections::BTreeSet<String>) {
    if let Ok(tokens) = proc_macro2::TokenStream::from_str(text) {
        idents_of(tokens, out);
    }
}

fn idents_of(tokens: proc_macro2::TokenStream, out: &mut std::collections::BTreeSet<String>) {
    for token in tokens {
        match token {
            proc_macro2::TokenTree::Ident(i) => {
                let s = i.to_string();
                out.insert(s.strip_prefix("r#").unwrap_or(&s).to_owned());
            }
            proc_macro2::TokenTree::Group(g) => idents_of(g.stream(), out),
            _ => {}
        }
    }
}
