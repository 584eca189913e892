//! The tables of the whole-system law tests (`law_through_cluster`, `optimistic`): a
//! 3-token vocabulary, docs/rule.md's p and q after the prompt, and pseudo-random
//! prefix-dependent rows (with zeros and one-hot rows) after that, uniform past `length`
//! tokens; plus the target's exact effective law computed as the target node computes it.

use std::path::{Path, PathBuf};

use specd_sampling::law::PrefixModel;
use specd_sampling::{DenseDist, Purpose, SamplingParams, StreamKey, TokenHistory, effective_distribution};

use crate::Table;

pub const VOCAB: usize = 3;
pub const PROMPT: [u32; 1] = [0];

/// The target's table and the draft's, for one law test.
#[derive(Debug, Clone)]
pub struct TablePair {
    pub target: Table,
    pub draft: Table,
}

/// Where [`TablePair::write`] put the pair's table-model files.
#[derive(Debug, Clone)]
pub struct TableFiles {
    pub target: PathBuf,
    pub draft: PathBuf,
}

impl TablePair {
    /// Writes the pair as `target.json` and `draft.json` in `dir`, the files a cluster loads.
    pub fn write(&self, dir: &Path) -> anyhow::Result<TableFiles> {
        Ok(TableFiles {
            target: self.target.write(&dir.join("target.json"))?,
            draft: self.draft.write(&dir.join("draft.json"))?,
        })
    }
}

/// Target and draft tables for continuations of up to `length` tokens after [`PROMPT`].
pub fn tables(length: usize) -> TablePair {
    tables_after(&PROMPT, length)
}

/// [`tables`] after another prompt (the proposers' audits use one that repeats itself, so
/// that an n-gram match proposes the token the target finds least likely).
pub fn tables_after(prompt: &[u32], length: usize) -> TablePair {
    let mut target = Table { vocab_size: VOCAB, default: vec![1.0 / 3.0; VOCAB], rules: Vec::new() };
    let mut draft = target.clone();
    target.rules.push((prompt.to_vec(), vec![0.6, 0.3, 0.1]));
    draft.rules.push((prompt.to_vec(), vec![0.5, 0.25, 0.25]));
    let mut prefixes = vec![prompt.to_vec()];
    for _ in 1..length {
        prefixes =
            prefixes.iter().flat_map(|p| (0..VOCAB as u32).map(move |t| [p.clone(), vec![t]].concat())).collect();
        for (i, prefix) in prefixes.iter().enumerate() {
            target.rules.push((prefix.clone(), row(i as u64, prefix.len() as u32, 1)));
            draft.rules.push((prefix.clone(), row(i as u64, prefix.len() as u32, 2)));
        }
    }
    TablePair { target, draft }
}

/// [`tables_after`] with every row's entries at least 0.05 (no zeros, no one-hot rows): under
/// an output constraint a row must keep mass on the tokens it allows, whichever they are.
pub fn positive_tables_after(prompt: &[u32], length: usize) -> TablePair {
    let TablePair { mut target, mut draft } = tables_after(prompt, length);
    for table in [&mut target, &mut draft] {
        for (_, probs) in table.rules.iter_mut() {
            let floored: Vec<f64> = probs.iter().map(|p| p + 0.05).collect();
            let total: f64 = floored.iter().sum();
            *probs = floored.iter().map(|p| p / total).collect();
        }
    }
    TablePair { target, draft }
}

/// Tables for conversations of two turns: [`tables_after`]'s rules after `prompt`, and after
/// each `prompt ++ first ++ [user]` (`first` any continuation of 1 to `length` tokens) rules
/// of its own, so that the second turn's law depends on every token of the first turn's
/// output.
pub fn conversation_tables(prompt: &[u32], user: u32, length: usize) -> TablePair {
    let TablePair { mut target, mut draft } = tables_after(prompt, length);
    // A history that is also another's (a short first turn, the user's token and what
    // follows, against a longer first turn) keeps the rule it got first.
    let mut keys: std::collections::HashSet<Vec<u32>> = target.rules.iter().map(|(key, _)| key.clone()).collect();
    // Past every index `tables_after` gives its rows.
    let mut index = 1 << 32;
    for first in (1..=length).flat_map(continuations) {
        let mut prefixes = vec![[prompt, &first, &[user]].concat()];
        for _ in 0..length {
            for prefix in prefixes.iter().filter(|p| keys.insert(p.to_vec())) {
                index += 1;
                target.rules.push((prefix.clone(), row(index, prefix.len() as u32, 1)));
                draft.rules.push((prefix.clone(), row(index, prefix.len() as u32, 2)));
            }
            prefixes =
                prefixes.iter().flat_map(|p| (0..VOCAB as u32).map(move |t| [p.clone(), vec![t]].concat())).collect();
        }
    }
    TablePair { target, draft }
}

/// Every sequence of `length` tokens, in [`cell`] order.
pub fn continuations(length: usize) -> Vec<Vec<u32>> {
    (0..VOCAB.pow(length as u32))
        .map(|c| (0..length).rev().map(|i| ((c / VOCAB.pow(i as u32)) % VOCAB) as u32).collect())
        .collect()
}

fn row(i: u64, depth: u32, salt: u32) -> Vec<f64> {
    let mut rng = StreamKey::new(i, depth, salt, Purpose::Plain).stream();
    if rng.next_uniform() < 0.15 {
        let mut one_hot = vec![0.0; VOCAB];
        one_hot[(rng.next_u32() as usize) % VOCAB] = 1.0;
        return one_hot;
    }
    let w: Vec<f64> =
        (0..VOCAB).map(|_| if rng.next_uniform() < 0.2 { 0.0 } else { 0.05 + rng.next_uniform() }).collect();
    let total: f64 = w.iter().sum();
    if total == 0.0 {
        return vec![1.0 / VOCAB as f64; VOCAB];
    }
    w.iter().map(|x| x / total).collect()
}

/// The target's effective distributions, computed as the target node does (logits ln p),
/// after [`PROMPT`].
#[derive(Debug)]
pub struct EffectiveTarget {
    pub table: Table,
    pub params: SamplingParams,
}

impl EffectiveTarget {
    /// After another prompt of `prompt_len` tokens.
    pub fn after(self, prompt_len: usize) -> EffectiveTargetAfter {
        EffectiveTargetAfter { target: self, prompt_len }
    }
}

/// [`EffectiveTarget`] after a prompt of `prompt_len` tokens.
#[derive(Debug)]
pub struct EffectiveTargetAfter {
    target: EffectiveTarget,
    prompt_len: usize,
}

impl PrefixModel for EffectiveTargetAfter {
    fn target(&self, prefix: &[u32]) -> DenseDist {
        effective_target(&self.target, prefix, self.prompt_len)
    }
    fn draft(&self, prefix: &[u32]) -> DenseDist {
        self.target(prefix)
    }
}

fn effective_target(model: &EffectiveTarget, prefix: &[u32], prompt_len: usize) -> DenseDist {
    let logits: Vec<f32> =
        model.table.probs(prefix).iter().map(|&p| if p > 0.0 { p.ln() as f32 } else { -1e30 }).collect();
    let history = TokenHistory { prompt: &prefix[..prompt_len], generated: &prefix[prompt_len..] };
    effective_distribution(&logits, &model.params, history).unwrap()
}

impl PrefixModel for EffectiveTarget {
    fn target(&self, prefix: &[u32]) -> DenseDist {
        effective_target(self, prefix, PROMPT.len())
    }
    fn draft(&self, prefix: &[u32]) -> DenseDist {
        self.target(prefix)
    }
}

/// [`EffectiveTarget`] under an output constraint, computed by hand rather than by the
/// grammar engine: the tokens `allowed` rules out after an output get logit −∞ before every
/// sampling setting (docs/rule.md#constrained-decoding).
pub struct ConstrainedTarget {
    pub target: EffectiveTarget,
    pub prompt_len: usize,
    /// Which of the [`VOCAB`] tokens may follow this output (the tokens after the prompt).
    pub allowed: fn(&[u32]) -> [bool; VOCAB],
}

impl std::fmt::Debug for ConstrainedTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstrainedTarget").field("target", &self.target).finish_non_exhaustive()
    }
}

impl PrefixModel for ConstrainedTarget {
    fn target(&self, prefix: &[u32]) -> DenseDist {
        let allowed = (self.allowed)(&prefix[self.prompt_len..]);
        let logits: Vec<f32> = self
            .target
            .table
            .probs(prefix)
            .iter()
            .zip(allowed)
            .map(|(&p, allowed)| if allowed && p > 0.0 { p.ln() as f32 } else { f32::NEG_INFINITY })
            .collect();
        let history = TokenHistory { prompt: &prefix[..self.prompt_len], generated: &prefix[self.prompt_len..] };
        effective_distribution(&logits, &self.target.params, history).unwrap()
    }
    fn draft(&self, prefix: &[u32]) -> DenseDist {
        self.target(prefix)
    }
}

/// The index of a continuation among the `VOCAB^length` cells.
pub fn cell(seq: &[u32]) -> usize {
    seq.iter().fold(0, |acc, &t| acc * VOCAB + t as usize)
}
