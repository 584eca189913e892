//! The prompts `specd bench` sends: a prompts file, or one of the built-in sets.

use std::path::Path;

use crate::cli_error::invalid;

/// The default prompts: beginnings of Python code, written for this benchmark.
const DEFAULT_PROMPTS: &str = include_str!("../../bench/prompts.txt");
/// `--prompt-set grounded`: work grounded in its input (edit, extend or quote the code the
/// prompt gives), where copying from the prompt pays (n-gram drafting).
const GROUNDED_PROMPTS: &str = include_str!("../../bench/grounded_prompts.txt");
/// Separates prompts in a prompts file (a line of its own).
const PROMPT_SEPARATOR: &str = "---";

/// The prompts of `--prompts` (a file), else of `--prompt-set`.
pub(super) fn load_prompts(path: Option<&Path>, set: &str) -> anyhow::Result<Vec<String>> {
    let text = match path {
        Some(p) => std::fs::read_to_string(p).map_err(|e| invalid(format!("--prompts {}: {e}", p.display())))?,
        None if set == "grounded" => GROUNDED_PROMPTS.to_owned(),
        None => DEFAULT_PROMPTS.to_owned(),
    };
    let mut prompts = Vec::new();
    let mut current = String::new();
    for line in text.split_inclusive('\n') {
        if line.trim_end() == PROMPT_SEPARATOR {
            prompts.push(std::mem::take(&mut current));
        } else {
            current.push_str(line);
        }
    }
    prompts.push(current);
    // The separator's own newline ends the previous prompt; a prompt keeps its trailing
    // newline only when it is followed by an empty line.
    let prompts: Vec<String> = prompts
        .into_iter()
        .map(|p| p.strip_suffix('\n').map(str::to_owned).unwrap_or(p))
        .filter(|p| !p.trim().is_empty())
        .collect();
    if prompts.is_empty() {
        return Err(invalid("the prompts file holds no prompt"));
    }
    Ok(prompts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_split_on_separator_lines_and_keep_their_indentation() {
        let p = load_prompts(None, "code").unwrap();
        assert!(p.len() >= 6);
        assert!(p[0].starts_with("def fibonacci(n):\n    \"\"\""));
        assert!(!p[0].ends_with('\n'));
        assert!(p.iter().all(|x| !x.contains("\n---\n")));
        let grounded = load_prompts(None, "grounded").unwrap();
        assert!(grounded.len() >= 6 && grounded.iter().all(|x| !x.contains("\n---\n")));
    }
}
