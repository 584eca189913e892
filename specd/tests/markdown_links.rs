//! Every relative link in the repository's Markdown files resolves inside the repository: the
//! file (or folder) exists, does not lie outside the checkout, and a `#fragment` into a
//! Markdown file names one of its headings. A user who clones the repository has nothing
//! else, so a link to `../shared/…` or to a heading that was renamed is a broken page.

use std::collections::HashSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// Folders that are not the repository's own pages.
const SKIPPED_DIRS: &[&str] = &[".git", "target", ".venv", "models", "node_modules", "fuzz/target"];

#[derive(Debug, PartialEq)]
struct BrokenLink {
    file: PathBuf,
    line: usize,
    target: String,
    why: String,
}

fn markdown_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let relative = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().into_owned();
        if path.is_dir() {
            if !SKIPPED_DIRS.contains(&relative.as_str()) {
                markdown_files(root, &path, out);
            }
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// Link targets of one line, outside inline code: `[text](target)`, `![alt](target)` and
/// reference definitions `[label]: target`.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let trimmed = line.trim_start();
    if trimmed.starts_with('[')
        && let Some(end) = trimmed.find("]:")
    {
        let rest = trimmed[end + 2..].trim();
        if let Some(target) = rest.split_whitespace().next() {
            targets.push(target.trim_matches(['<', '>']).to_string());
        }
        return targets;
    }
    let mut in_code = false;
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '`' => in_code = !in_code,
            ']' if !in_code && chars.get(i + 1) == Some(&'(') => {
                let start = i + 2;
                let mut depth = 1;
                let mut j = start;
                while j < chars.len() {
                    match chars[j] {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                if j < chars.len() {
                    let inner: String = chars[start..j].iter().collect();
                    // `[text](target "title")`
                    let target = inner.split_whitespace().next().unwrap_or("");
                    targets.push(target.trim_matches(['<', '>']).to_string());
                    i = j;
                }
            }
            _ => {}
        }
        i += 1;
    }
    targets
}

/// The anchor GitHub gives a heading: lower case, punctuation dropped except `-` and `_`,
/// spaces to `-`; letters of any script kept.
fn heading_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors_of(markdown: &str) -> HashSet<String> {
    let mut anchors = HashSet::new();
    let mut in_fence = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        if let Some(heading) = line.strip_prefix('#') {
            let text = heading.trim_start_matches('#');
            if text.starts_with(' ') {
                let base = heading_anchor(text);
                // Repeated headings get -1, -2, … as on GitHub.
                let mut anchor = base.clone();
                let mut n = 0;
                while !anchors.insert(anchor.clone()) {
                    n += 1;
                    anchor = format!("{base}-{n}");
                }
            }
        }
    }
    anchors
}

/// `path` with `.` and `..` resolved lexically (the target may not exist).
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn check_file(root: &Path, file: &Path) -> Vec<BrokenLink> {
    let text = fs::read_to_string(file).unwrap_or_default();
    let mut broken = Vec::new();
    let mut in_fence = false;
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        for target in link_targets(line) {
            let is_external = target.contains("://") || target.starts_with("mailto:");
            if target.is_empty() || is_external {
                continue;
            }
            let (path_part, fragment) = match target.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (target.as_str(), None),
            };
            let resolved = if path_part.is_empty() {
                file.to_path_buf()
            } else if let Some(absolute) = path_part.strip_prefix('/') {
                root.join(absolute)
            } else {
                normalise(&file.parent().unwrap_or(root).join(path_part))
            };
            let mut fail = |why: String| {
                broken.push(BrokenLink {
                    file: file.strip_prefix(root).unwrap_or(file).to_path_buf(),
                    line: index + 1,
                    target: target.clone(),
                    why,
                });
            };
            if !resolved.starts_with(root) {
                fail("points outside the repository".into());
                continue;
            }
            if !resolved.exists() {
                fail("no such file or folder".into());
                continue;
            }
            if let Some(fragment) = fragment
                && resolved.extension().is_some_and(|e| e == "md")
            {
                let anchors = anchors_of(&fs::read_to_string(&resolved).unwrap_or_default());
                if !anchors.contains(fragment) {
                    fail(format!("no heading with the anchor #{fragment}"));
                }
            }
        }
    }
    broken
}

fn broken_links(root: &Path) -> Vec<BrokenLink> {
    let mut files = Vec::new();
    markdown_files(root, root, &mut files);
    files.sort();
    files.iter().flat_map(|f| check_file(root, f)).collect()
}

#[test]
fn every_relative_link_in_the_repository_resolves() {
    let root = normalise(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    let mut files = Vec::new();
    markdown_files(&root, &root, &mut files);
    assert!(files.iter().any(|f| f.ends_with("README.md")), "no Markdown found under {}", root.display());
    let broken = broken_links(&root);
    let report: Vec<String> =
        broken.iter().map(|b| format!("{}:{}: ({}) {}", b.file.display(), b.line, b.target, b.why)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", report.join("\n"));
}

#[test]
fn the_checker_finds_each_kind_of_broken_link() {
    let dir = std::env::temp_dir().join(format!("specd-links-{}", std::process::id()));
    let repo = dir.join("repo");
    fs::create_dir_all(repo.join("docs")).unwrap();
    fs::write(dir.join("outside.md"), "# Outside\n").unwrap();
    fs::write(repo.join("docs/guide.md"), "# The guide\n\n## Running the roles\n\n## Running the roles\n").unwrap();
    let readme = [
        "[ok](docs/guide.md) and [ok anchor](docs/guide.md#running-the-roles)",
        "[second heading](docs/guide.md#running-the-roles-1) and [folder](docs/)",
        "[web](https://example.invalid/x) `[code](missing.md)`",
        "[missing](docs/missing.md)",
        "[outside](../outside.md)",
        "[bad anchor](docs/guide.md#no-such-heading)",
        "[ref]: docs/also-missing.md",
        "```",
        "[in a fence](fenced-missing.md)",
        "```",
    ]
    .join("\n");
    fs::write(repo.join("README.md"), readme).unwrap();
    let found: Vec<(usize, String)> = broken_links(&repo).into_iter().map(|b| (b.line, b.target)).collect();
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        found,
        vec![
            (4, "docs/missing.md".to_string()),
            (5, "../outside.md".to_string()),
            (6, "docs/guide.md#no-such-heading".to_string()),
            (7, "docs/also-missing.md".to_string()),
        ]
    );
}

#[test]
fn anchors_follow_github() {
    assert_eq!(
        heading_anchor("The demo pair, `specd bench` and the calculators"),
        "the-demo-pair-specd-bench-and-the-calculators"
    );
    assert_eq!(heading_anchor("Across a network: `specd bench --netns`"), "across-a-network-specd-bench---netns");
    assert_eq!(heading_anchor("Adaptive γ at 0, 5 ms"), "adaptive-γ-at-0-5-ms");
}
