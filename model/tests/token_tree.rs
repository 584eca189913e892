//! Token trees: one pass scores every node as if its path had been forwarded alone (each
//! node at the position of its depth, attending to the cache and its ancestors only, within
//! a sliding window where the family has one), and after `keep_tree_path` the session's
//! cache is what a fresh pass over the kept tokens writes, on every fixture family and on
//! both engines.

mod common;

use anyhow::Result;
use common::{FIXTURES, cpu_f32, fixture, max_abs_diff, reference};
use specd_model::{AttentionOptions, Engine, KeyLengths, LanguageModel, LoadOptions, TokenTree, load_model};

/// float32 noise between a tree pass and a pass over one path (the rows are computed in
/// other shapes, as in a block against single tokens: kv_cache.rs); a wrong mask or a wrong
/// position is off by far more (asserted below).
const TOL: f32 = 2e-5;

const PROMPT: usize = 6;

/// Roots 0 and 1; 2 and 3 under 0; 4 under 2; 5 under 1: depths 0, 0, 1, 1, 2, 1.
fn tree(tokens: &[u32]) -> TokenTree {
    let nodes = tokens[PROMPT..PROMPT + 6].to_vec();
    TokenTree::new(nodes, vec![None, None, Some(0), Some(0), Some(2), Some(1)]).unwrap()
}

/// The last row of a fresh session over `tokens`.
fn fresh_last_row(m: &mut dyn LanguageModel, tokens: &[u32]) -> Result<Vec<f32>> {
    let s = m.open_session(None)?;
    let row = m.forward_last(s, tokens, 1)?.into_host()?.as_slice().to_vec();
    m.release(s)?;
    Ok(row)
}

/// A chain of six below a root (depths 0 to 5, deeper than the fixtures' sliding windows of
/// 4 to 6 positions reach back: a node there sees only part of its own path) and a second
/// child of that root.
fn deep_tree(tokens: &[u32]) -> TokenTree {
    let nodes = tokens[PROMPT..PROMPT + 7].to_vec();
    TokenTree::new(nodes, vec![None, Some(0), Some(1), Some(2), Some(3), Some(4), Some(0)]).unwrap()
}

/// Scores `tree` after `prompt` in one pass, checks each row against its node's path alone,
/// and returns the rows.
fn rows_match_paths(name: &str, m: &mut dyn LanguageModel, prompt: &[u32], tree: &TokenTree) -> Result<Vec<Vec<f32>>> {
    let s = m.open_session(None)?;
    m.forward(s, prompt)?;
    let rows = m.forward_tree(s, tree)?.into_host()?.to_rows();
    m.release(s)?;
    assert_eq!(rows.len(), tree.len(), "{name}: a row per node");
    for (node, row) in rows.iter().enumerate() {
        let alone = fresh_last_row(m, &[prompt, &tree.path_tokens(&tree.path_to(node))].concat())?;
        let diff = max_abs_diff(std::slice::from_ref(row), &[alone]);
        assert!(diff <= TOL, "{name}: node {node} of {tree:?}, tree pass vs its path alone {diff}");
    }
    Ok(rows)
}

fn check(name: &str, m: &mut dyn LanguageModel) -> Result<()> {
    let tokens = reference(name)?.tokens;
    let tree = tree(&tokens);
    let prompt = &tokens[..PROMPT];
    let rows = rows_match_paths(name, m, prompt, &tree)?;
    rows_match_paths(name, m, prompt, &deep_tree(&tokens))?;
    // Not vacuous: node 1, a root, differs from what it scores as the chain's second token
    // (after node 0), which an unmasked pass would give.
    let chain = fresh_last_row(m, &[prompt, &tree.tokens()[..2]].concat())?;
    let diff = max_abs_diff(&rows[1..2], &[chain]);
    assert!(diff > 1e-3, "{name}: a root's row equals the chain's ({diff}): the mask is not tested");

    // Keeping a path that is not a prefix of the nodes (1 then 5) moves their cache rows; a
    // further pass then sees the prompt and that path only.
    let next = tokens[PROMPT + 6];
    for path in [vec![1, 5], vec![0, 2, 4], vec![0], vec![]] {
        let s2 = m.open_session(None)?;
        m.forward(s2, prompt)?;
        m.forward_tree(s2, &tree)?;
        m.keep_tree_path(s2, PROMPT, &tree, &path)?;
        assert_eq!(m.session_len(s2)?, PROMPT + path.len(), "{name} {path:?}");
        let after = m.forward_last(s2, &[next], 1)?.into_host()?.as_slice().to_vec();
        let kept = [prompt, &tree.path_tokens(&path), &[next]].concat();
        let fresh = fresh_last_row(m, &kept)?;
        let diff = max_abs_diff(&[after], &[fresh]);
        assert!(diff <= TOL, "{name}: after keeping {path:?}, {diff} from a fresh pass over the kept tokens");
        m.release(s2)?;
    }
    // A path that is not one is refused, and the session keeps its length.
    let s3 = m.open_session(None)?;
    m.forward(s3, prompt)?;
    m.forward_tree(s3, &tree)?;
    assert!(m.keep_tree_path(s3, PROMPT, &tree, &[0, 5]).is_err(), "{name}: 5 is not a child of 0");
    m.release(s3)?;
    Ok(())
}

#[test]
fn a_tree_pass_scores_each_node_as_its_path_alone_and_keeps_one_path_exactly() -> Result<()> {
    for name in FIXTURES {
        let mut m = load_model(&fixture(name), &LoadOptions { engine: Engine::Libtorch, ..cpu_f32() })?;
        assert_eq!(m.info().engine, "libtorch");
        check(name, &mut m)?;
    }
    Ok(())
}

#[test]
fn trees_hold_with_bucketed_keys_and_repeated_kv_heads() -> Result<()> {
    // Keys past the tree's nodes (a bucket's padding) stay masked; grouped-query heads
    // repeated before attention see the same mask.
    let attention = AttentionOptions { keys: KeyLengths::Bucketed(16), expand_kv_heads: true, ..Default::default() };
    for name in ["llama_gqa_untied", "mistral_window", "gemma3"] {
        let options = LoadOptions { engine: Engine::Libtorch, attention, ..cpu_f32() };
        check(name, &mut load_model(&fixture(name), &options)?)?;
    }
    Ok(())
}

#[test]
fn the_host_engine_scores_a_tree_in_one_pass_and_keeps_one_path_exactly() -> Result<()> {
    for name in FIXTURES {
        let mut m = load_model(&fixture(name), &LoadOptions { engine: Engine::Host, ..cpu_f32() })?;
        assert_eq!(m.info().engine, "host");
        check(name, &mut m)?;
    }
    Ok(())
}
