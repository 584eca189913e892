//! Exact laws of tree rounds by enumeration ([`crate::tree_rule`]): the committed sequences of
//! one round, the joint law of the first L tokens over chained rounds, and the expected
//! number of accepted candidates, for a tree of a given shape drafted from a
//! [`PrefixModel`].
//!
//! Every node's children are enumerated as ordered draws (with or without replacement) from
//! its q, and each child's subtree independently, so a round's law costs the number of
//! distinct (node, ordered draws) pairs rather than the number of whole trees.

use std::collections::BTreeMap;

use crate::dist::DenseDist;
use crate::law::{PrefixModel, WireFormat};
use crate::tree_rule::{ChildDraws, DenseRunning, Running};

/// Children per depth: `widths[d]` children under every node at depth d (the root is at
/// depth 0); nodes deeper than the list are leaves. A chain of γ is `[1; γ]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeShape {
    pub widths: Vec<usize>,
}

/// The most candidates a drafted tree may hold: what one target pass scores besides the
/// committed sequence.
pub const MAX_TREE_CANDIDATES: usize = 64;

impl TreeShape {
    /// A shape whose every depth has at least one child, at most [`crate::MAX_GAMMA`] depths
    /// deep and at most [`MAX_TREE_CANDIDATES`] candidates in all.
    pub fn new(widths: Vec<usize>) -> Result<Self, String> {
        if widths.is_empty() || widths.contains(&0) {
            return Err(format!("tree {widths:?}: every depth needs at least one child"));
        }
        if widths.len() > crate::MAX_GAMMA as usize {
            return Err(format!("tree {widths:?}: {} depths, above the maximum {}", widths.len(), crate::MAX_GAMMA));
        }
        // Checked level by level: a product of widths may overflow long before the sum does.
        let mut level: usize = 1;
        let mut total: usize = 0;
        for &w in &widths {
            level = level.saturating_mul(w);
            total = total.saturating_add(level);
        }
        if total > MAX_TREE_CANDIDATES {
            return Err(format!("tree {widths:?}: {total} candidates, above the maximum {MAX_TREE_CANDIDATES}"));
        }
        Ok(Self { widths })
    }

    /// A chain of `gamma`: one child per depth.
    pub fn chain(gamma: usize) -> Self {
        Self { widths: vec![1; gamma] }
    }

    /// Depths below the committed sequence: the longest path's candidates.
    pub fn depth(&self) -> usize {
        self.widths.len()
    }

    /// Whether every depth has one child.
    pub fn is_chain(&self) -> bool {
        self.widths.iter().all(|&w| w == 1)
    }

    /// Candidates in a full tree of this shape: the positions a target pass scores besides
    /// the root.
    pub fn candidates(&self) -> usize {
        let mut level = 1;
        let mut total = 0;
        for &w in &self.widths {
            level *= w;
            total += level;
        }
        total
    }
}

/// `W1,W2,...`: children per depth, as `--tree` takes them.
impl std::str::FromStr for TreeShape {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let widths = s
            .split(',')
            .map(|w| w.trim().parse::<usize>().map_err(|_| format!("tree {s:?}: {w:?} is not a number of children")))
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(widths)
    }
}

impl std::fmt::Display for TreeShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let widths: Vec<String> = self.widths.iter().map(ToString::to_string).collect();
        f.write_str(&widths.join(","))
    }
}

/// What a tree round needs to know besides the model.
#[derive(Debug, Clone, Copy)]
pub struct TreeRound<'a> {
    pub shape: &'a TreeShape,
    pub draws: ChildDraws,
    pub wire: WireFormat,
}

impl TreeRound<'_> {
    fn q(&self, model: &dyn PrefixModel, context: &[u32]) -> DenseDist {
        match self.wire {
            WireFormat::Dense => model.draft(context),
            // The complement sample draws the outside exactly: the law is that of q truncated.
            WireFormat::Sparse(truncation) => model.draft(context).truncate(truncation).to_dense(),
        }
    }

    fn width(&self, depth: usize) -> usize {
        self.shape.widths.get(depth).copied().unwrap_or(0)
    }
}

/// Ordered draws of up to `k` children from `q`, with their probabilities. Without
/// replacement, drawing stops early when no mass is left.
fn ordered_draws(q: &[f64], k: usize, draws: ChildDraws) -> Vec<(Vec<u32>, f64)> {
    let mut out = vec![(Vec::new(), 1.0)];
    for _ in 0..k {
        let mut longer = Vec::new();
        for (seq, w) in out {
            let mut q_now = q.to_vec();
            if draws == ChildDraws::WithoutReplacement {
                for &t in &seq {
                    q_now[t as usize] = 0.0;
                }
            }
            let mass: f64 = q_now.iter().sum();
            if mass <= 0.0 {
                longer.push((seq, w));
                continue;
            }
            for (x, &qx) in q_now.iter().enumerate() {
                if qx > 0.0 {
                    let mut s = seq.clone();
                    s.push(x as u32);
                    longer.push((s, w * qx / mass));
                }
            }
        }
        out = longer;
    }
    out
}

/// The sequences a round commits from the node after `context` at `depth`, with their
/// probabilities.
fn node_law(
    model: &dyn PrefixModel,
    context: &mut Vec<u32>,
    depth: usize,
    round: TreeRound<'_>,
) -> Vec<(Vec<u32>, f64)> {
    let p = model.target(context);
    let k = round.width(depth);
    if k == 0 {
        return p.probs().iter().enumerate().filter(|(_, w)| **w > 0.0).map(|(y, w)| (vec![y as u32], *w)).collect();
    }
    let q = round.q(model, context);
    let mut below: BTreeMap<u32, Vec<(Vec<u32>, f64)>> = BTreeMap::new();
    let mut out: BTreeMap<Vec<u32>, f64> = BTreeMap::new();
    for (seq, weight) in ordered_draws(q.probs(), k, round.draws) {
        // The rule's own running residual, so that the law is that of the code that runs.
        let (mut at, mut reach) = (DenseRunning::exact(p.probs().to_vec(), q.probs().to_vec()), weight);
        for &x in &seq {
            let accept = at.ratio(x).min(1.0);
            if accept > 0.0 {
                let sub = below.entry(x).or_insert_with(|| {
                    context.push(x);
                    let law = node_law(model, context, depth + 1, round);
                    context.pop();
                    law
                });
                for (tail, w) in sub.iter() {
                    let mut committed = vec![x];
                    committed.extend(tail);
                    *out.entry(committed).or_default() += reach * accept * w;
                }
            }
            reach *= 1.0 - accept;
            at.reject(x, round.draws);
        }
        for (y, &w) in at.p.iter().enumerate() {
            if w > 0.0 {
                *out.entry(vec![y as u32]).or_default() += reach * w;
            }
        }
    }
    out.into_iter().collect()
}

/// The committed sequences of one tree round after `prefix`, with their probabilities.
pub fn tree_round_law(model: &dyn PrefixModel, prefix: &[u32], round: TreeRound<'_>) -> Vec<(Vec<u32>, f64)> {
    node_law(model, &mut prefix.to_vec(), 0, round)
}

/// The joint law of the first `length` tokens of chained tree rounds from `prompt`.
pub fn tree_sequence_law(
    model: &dyn PrefixModel,
    prompt: &[u32],
    length: usize,
    round: TreeRound<'_>,
) -> BTreeMap<Vec<u32>, f64> {
    fn chain(
        model: &dyn PrefixModel,
        context: &mut Vec<u32>,
        base: usize,
        length: usize,
        round: TreeRound<'_>,
        weight: f64,
        law: &mut BTreeMap<Vec<u32>, f64>,
    ) {
        if context.len() - base >= length {
            *law.entry(context[base..base + length].to_vec()).or_default() += weight;
            return;
        }
        for (tokens, w) in tree_round_law(model, context, round) {
            let before = context.len();
            context.extend(&tokens);
            chain(model, context, base, length, round, weight * w, law);
            context.truncate(before);
        }
    }
    let mut law = BTreeMap::new();
    chain(model, &mut prompt.to_vec(), prompt.len(), length, round, 1.0, &mut law);
    law
}

/// The exact expected number of candidates a tree round after `prefix` accepts.
pub fn tree_expected_accepted(model: &dyn PrefixModel, prefix: &[u32], round: TreeRound<'_>) -> f64 {
    fn expected(model: &dyn PrefixModel, context: &mut Vec<u32>, depth: usize, round: TreeRound<'_>) -> f64 {
        let k = round.width(depth);
        if k == 0 {
            return 0.0;
        }
        let p = model.target(context);
        let q = round.q(model, context);
        let mut below: BTreeMap<u32, f64> = BTreeMap::new();
        let mut total = 0.0;
        for (seq, weight) in ordered_draws(q.probs(), k, round.draws) {
            let (mut at, mut reach) = (DenseRunning::exact(p.probs().to_vec(), q.probs().to_vec()), weight);
            for &x in &seq {
                let accept = at.ratio(x).min(1.0);
                let sub = *below.entry(x).or_insert_with(|| {
                    context.push(x);
                    let e = expected(model, context, depth + 1, round);
                    context.pop();
                    e
                });
                total += reach * accept * (1.0 + sub);
                reach *= 1.0 - accept;
                at.reject(x, round.draws);
            }
        }
        total
    }
    expected(model, &mut prefix.to_vec(), 0, round)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_refuse_what_a_pass_cannot_hold() {
        let shape: TreeShape = "3, 2,1".parse().unwrap();
        assert_eq!(shape.widths, [3, 2, 1]);
        assert_eq!((shape.candidates(), shape.depth(), shape.is_chain()), (3 + 6 + 6, 3, false));
        assert_eq!(shape.to_string(), "3,2,1");
        assert!(TreeShape::chain(4).is_chain());
        for (bad, says) in [
            ("2,0", "at least one child"),
            ("", "not a number"),
            ("2,x", "not a number"),
            ("8,8", "72 candidates"),
            ("64,64,64,64,64,64,64,64,64,64,64,64", "above the maximum 64"),
        ] {
            let err = bad.parse::<TreeShape>().unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
        let deep = vec!["1"; crate::MAX_GAMMA as usize + 1].join(",");
        assert!(deep.parse::<TreeShape>().unwrap_err().contains("depths"));
    }
}
