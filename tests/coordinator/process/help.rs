//! `--help` of every command is for the people who run the binary: no rustdoc markup
//! (backticks, `[text](link)`) and no citations of a SPEC they do not have.

use super::holdfast_command;

/// The subcommands a `--help` page lists (its `Commands:` section), `help` aside.
fn subcommands(page: &str) -> Vec<String> {
    page.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("    "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn help_pages_are_plain_text_without_spec_citations() {
    let mut pending: Vec<Vec<String>> = vec![vec![]];
    let mut seen = 0;
    while let Some(path) = pending.pop() {
        let out = holdfast_command()
            .args(&path)
            .arg("--help")
            .output()
            .expect("run holdfast --help");
        let page = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "holdfast {path:?} --help: {page}");
        let shown = format!("holdfast {} --help", path.join(" "));
        for bad in ["SPEC ", "](", "`"] {
            let line = page.lines().find(|l| l.contains(bad));
            assert!(
                line.is_none(),
                "{shown} shows {bad:?}: {}",
                line.unwrap_or("")
            );
        }
        for name in subcommands(&page) {
            let mut next = path.clone();
            next.push(name);
            pending.push(next);
        }
        seen += 1;
    }
    // The roles, the CLI, its admin and events commands, keys: every page was read.
    assert!(seen >= 20, "only {seen} help pages found");
}
