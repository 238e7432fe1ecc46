//! SPEC 13: each library crate a user depends on has a README with a dependency snippet and a
//! complete example, and the manifest crates.io shows. The examples cannot rot: a README quotes
//! a file of the crate's `examples/` (marked `<!-- example: examples/NAME.rs -->` before a
//! ```` ```rust ```` block), the quote must be that file to the byte, and `cargo test` compiles
//! every example (and runs those declared `test = true`). A ```` ```rust ```` block that quotes
//! no example is refused, so no Rust in a README goes unchecked. `HOLDFAST_TIDY_BLESS=1` copies
//! the examples into the READMEs again (after `cargo fmt`, say); check the diff it makes.

use std::path::Path;
use std::str::FromStr;

/// The library crates of SPEC 13, each published with its README.
const PUBLISHED: [&str; 5] = [
    "holdfast-proto",
    "holdfast-client",
    "holdfast-participant",
    "holdfast-serve",
    "holdfast-testkit",
];

/// The marker of a quoted example, before its ```` ```rust ```` block.
const MARKER: &str = "<!-- example: ";

/// What is wrong with the README of the crate `name` in `dir` (empty when nothing is).
fn readme_problems(name: &str, dir: &Path) -> Vec<String> {
    let path = dir.join("README.md");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return vec![format!("{name}: no README.md")];
    };
    let mut problems = Vec::new();
    let blocks = fenced_blocks(&text);
    let snippet = blocks.iter().any(|b| {
        b.lang == "toml"
            && b.body.contains("dependencies]")
            && b.body.lines().any(|l| l.starts_with(&format!("{name} =")))
    });
    if !snippet {
        problems.push(format!(
            "{name}/README.md: no ```toml block naming `{name} = ...` under [dependencies] or [dev-dependencies]"
        ));
    }
    let mut quoted = 0;
    for block in blocks.iter().filter(|b| b.lang == "rust") {
        let Some(file) = &block.quotes else {
            problems.push(format!(
                "{name}/README.md line {}: a ```rust block that quotes no example (put `{MARKER}examples/NAME.rs -->` before it)",
                block.line
            ));
            continue;
        };
        quoted += 1;
        if !file.starts_with("examples/") {
            problems.push(format!(
                "{name}/README.md line {}: {file} is not under examples/ (cargo test compiles only those)",
                block.line
            ));
        }
        match std::fs::read_to_string(dir.join(file)) {
            Ok(source) if source.trim_end() == block.body.trim_end() => {}
            Ok(_) => problems.push(format!(
                "{name}/README.md line {}: the block is not {file} as it is (copy the file again)",
                block.line
            )),
            Err(e) => problems.push(format!("{name}/README.md: {file}: {e}")),
        }
    }
    if quoted == 0 {
        problems.push(format!("{name}/README.md: quotes no example"));
    }
    problems
}

/// What is missing from the `[package]` table of the crate `name` in `dir` that crates.io
/// shows (description, license, repository, readme, keywords).
fn manifest_problems(name: &str, dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
    let Ok(manifest) = toml::Table::from_str(&text) else {
        return vec![format!("{name}/Cargo.toml does not parse")];
    };
    let package = manifest.get("package").and_then(|p| p.as_table());
    let field = |key: &str| package.and_then(|p| p.get(key));
    let mut problems = Vec::new();
    for key in ["description", "license", "repository", "readme", "keywords"] {
        if field(key).is_none() {
            problems.push(format!("{name}/Cargo.toml: no package.{key}"));
        }
    }
    if field("readme").and_then(|r| r.as_str()) != Some("README.md") {
        problems.push(format!("{name}/Cargo.toml: readme is not \"README.md\""));
    }
    problems
}

/// Rewrites each quoted block of the README in `dir` with its file as it is now.
fn bless(dir: &Path) -> std::io::Result<()> {
    let path = dir.join("README.md");
    let text = std::fs::read_to_string(&path)?;
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        out.push_str(line);
        out.push('\n');
        let quoted = line
            .trim()
            .strip_prefix(MARKER)
            .and_then(|rest| rest.strip_suffix("-->"))
            .map(str::trim);
        let Some(file) = quoted else { continue };
        if !lines.peek().is_some_and(|l| l.starts_with("```rust")) {
            continue;
        }
        out.push_str("```rust\n");
        // The old body, up to and with its closing fence.
        for old in lines.by_ref().skip(1) {
            if old.trim_end() == "```" {
                break;
            }
        }
        out.push_str(std::fs::read_to_string(dir.join(file))?.trim_end());
        out.push_str("\n```\n");
    }
    std::fs::write(path, out)
}

/// A fenced block of a Markdown file.
struct Block {
    /// The info string's first word (`rust`, `toml`, ...).
    lang: String,
    body: String,
    /// The line of its opening fence (1-based).
    line: usize,
    /// The file a marker on the line before names.
    quotes: Option<String>,
}

fn fenced_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    let mut previous = "";
    for (i, line) in text.lines().enumerate() {
        match open.as_mut() {
            Some(block) if line.trim_end() == "```" => {
                blocks.push(std::mem::replace(block, Block::empty()));
                open = None;
            }
            Some(block) => {
                block.body.push_str(line);
                block.body.push('\n');
            }
            None => {
                if let Some(info) = line.strip_prefix("```") {
                    let quotes = previous
                        .trim()
                        .strip_prefix(MARKER)
                        .and_then(|rest| rest.strip_suffix("-->"))
                        .map(|file| file.trim().to_owned());
                    open = Some(Block {
                        lang: info.split([',', ' ']).next().unwrap_or("").to_owned(),
                        body: String::new(),
                        line: i + 1,
                        quotes,
                    });
                }
            }
        }
        previous = line;
    }
    blocks
}

impl Block {
    fn empty() -> Block {
        Block {
            lang: String::new(),
            body: String::new(),
            line: 0,
            quotes: None,
        }
    }
}

#[test]
fn every_published_crate_has_a_readme_quoting_its_examples_and_a_full_manifest() {
    let members = super::workspace::members();
    let mut problems = Vec::new();
    for name in PUBLISHED {
        let Some(member) = members.iter().find(|m| m.name == name) else {
            problems.push(format!("{name}: not a member of the workspace"));
            continue;
        };
        if std::env::var_os("HOLDFAST_TIDY_BLESS").is_some()
            && let Err(e) = bless(&member.dir)
        {
            problems.push(format!("{name}: blessing its README: {e}"));
        }
        problems.extend(readme_problems(name, &member.dir));
        problems.extend(manifest_problems(name, &member.dir));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_quote_is_read_from_the_marker_before_its_block() {
    let text = "x\n<!-- example: examples/a.rs -->\n```rust\nfn main() {}\n```\n```toml\n[dependencies]\n```\n";
    let blocks = fenced_blocks(text);
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0].quotes.as_deref(), Some("examples/a.rs"));
    assert_eq!(blocks[0].body, "fn main() {}\n");
    assert_eq!(
        (blocks[1].lang.as_str(), blocks[1].quotes.as_ref()),
        ("toml", None)
    );
}
