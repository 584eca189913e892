//! `make help` names every target of the Makefile, and `.PHONY` lists only targets that
//! exist: a newcomer reads the help, not the Makefile.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn makefile() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("specd/ has a parent");
    std::fs::read_to_string(root.join("Makefile")).expect("the Makefile")
}

/// Explicit targets: `name:` at the start of a line, not a variable (`:=`) nor a pattern or
/// file rule (those hold `$`, `/` or `.`).
fn targets(makefile: &str) -> BTreeSet<String> {
    makefile
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let is_target = !name.is_empty()
                && !rest.starts_with('=')
                && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            is_target.then(|| name.to_owned())
        })
        .collect()
}

#[test]
fn make_help_names_every_target() {
    let makefile = makefile();
    let targets = targets(&makefile);
    assert!(targets.contains("demo") && targets.contains("test") && targets.len() > 10, "{targets:?}");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out = Command::new("make").args(["-s", "help"]).current_dir(root).output().expect("make runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let help = String::from_utf8_lossy(&out.stdout);
    let named: BTreeSet<String> = help
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[0] == "make")
        .map(|w| w[1].trim_end_matches(',').to_owned())
        .collect();
    let missing: Vec<&String> = targets.iter().filter(|t| !named.contains(*t)).collect();
    assert!(missing.is_empty(), "make help does not name {missing:?}:\n{help}");
    let phony: BTreeSet<String> = makefile
        .lines()
        .find_map(|l| l.strip_prefix(".PHONY:"))
        .expect(".PHONY")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let unknown: Vec<&String> = phony.difference(&targets).collect();
    assert!(unknown.is_empty(), ".PHONY lists {unknown:?}, which are not targets");
}

#[test]
fn the_target_reader_finds_targets_and_skips_variables() {
    let found = targets("VENV := x\nall: build\nhelp:\n$(PYTHON):\n\tdo: nothing\nTORCH_LIB = y\n");
    assert_eq!(found, BTreeSet::from(["all".to_owned(), "help".to_owned()]));
}
