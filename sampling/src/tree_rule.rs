//! Exact verification of a tree of drafts: recursive rejection sampling over the children of
//! each node (SpecInfer's multi-step speculative sampling, Miao et al. 2024, with children
//! drawn with replacement; recursive rejection sampling without replacement, Jeon et al.
//! 2024, arXiv:2402.14160).
//!
//! Node 0 is the committed prefix; every other node is a candidate token whose parent comes
//! before it. The children of a node u were drawn one after another from the draft's q_u:
//! with replacement each from q_u itself, without replacement each from q_u with the tokens
//! already drawn removed and the rest renormalised. At u, with the target's p_u:
//!
//! 1. p′ = p_u, q′ = the distribution the first child was drawn from;
//! 2. for each child c in draw order: accept its token x with probability min(1, p′(x)/q′(x))
//!    and continue at c; otherwise p′ ← norm(max(p′ − q′, 0)) and q′ ← the distribution the
//!    next child was drawn from;
//! 3. when every child is rejected, commit one token from p′ and stop; at a node without
//!    children, commit the bonus token from p_u and stop.
//!
//! Each step is the token rule with the residual of the step before as its target, so the
//! committed token at u has law p_u (docs/rule.md has the induction), and a round commits the
//! accepted path and one token. A chain is a tree whose nodes have one child each, and the
//! rule is then token verification draw for draw.
//!
//! Draws: `(Accept, c)` for child c's uniform (c ≥ 1 is its node index), `(Residual, u + 1)`
//! for the token after every child of u was rejected, and the target's `(Bonus, u + 1)` at a
//! leaf u and `(Complement, u + 1)` for u's complement sample on the sparse wire.

use std::fmt;
use std::str::FromStr;

use crate::dist::{DenseDist, SparseDist, sample_weights};
use crate::error::{Result, SamplingError};
use crate::rng::{DrawKeys, Purpose};
use crate::rule::EmittedFrom;
use crate::target_pieces::ScoredNode;

/// How a node's children were drawn from its q.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChildDraws {
    /// Each child from q itself: two children may carry the same token.
    WithReplacement,
    /// Each child from q without the tokens drawn before it, renormalised.
    WithoutReplacement,
}

impl ChildDraws {
    pub const ALL: [ChildDraws; 2] = [ChildDraws::WithReplacement, ChildDraws::WithoutReplacement];

    pub fn name(self) -> &'static str {
        match self {
            Self::WithReplacement => "with-replacement",
            Self::WithoutReplacement => "without-replacement",
        }
    }
}

impl fmt::Display for ChildDraws {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ChildDraws {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown child draws {s:?}: expected with-replacement or without-replacement"))
    }
}

/// A drafted tree: node 0 is the committed prefix, node i ≥ 1 the candidate `tokens[i − 1]`
/// whose parent is `parents[i − 1]` (< i). Siblings are in the order they were drawn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftTree {
    pub parents: Vec<usize>,
    pub tokens: Vec<u32>,
}

impl DraftTree {
    /// A chain of `tokens`: node i's parent is i − 1.
    pub fn chain(tokens: Vec<u32>) -> Self {
        Self { parents: (0..tokens.len()).collect(), tokens }
    }

    /// Nodes, the root included.
    pub fn len(&self) -> usize {
        self.tokens.len() + 1
    }

    /// Only the root: a target-only round.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The children of `node`, in draw order.
    pub fn children(&self, node: usize) -> Vec<usize> {
        (1..self.len()).filter(|&c| self.parents[c - 1] == node).collect()
    }

    /// The token of node `node` ≥ 1.
    pub fn token(&self, node: usize) -> u32 {
        self.tokens[node - 1]
    }

    /// Checks the shape: one parent per token, each before its child, and (without
    /// replacement) no two siblings with the same token.
    pub fn validate(&self, draws: ChildDraws) -> Result<()> {
        if self.parents.len() != self.tokens.len() {
            return Err(SamplingError::ShapeMismatch(format!(
                "{} parents for {} tree nodes",
                self.parents.len(),
                self.tokens.len()
            )));
        }
        for (i, &parent) in self.parents.iter().enumerate() {
            if parent > i {
                return Err(SamplingError::ShapeMismatch(format!("node {} has parent {parent}, not before it", i + 1)));
            }
        }
        if draws == ChildDraws::WithoutReplacement {
            for node in 0..self.len() {
                let children = self.children(node);
                for (k, &c) in children.iter().enumerate() {
                    if children[..k].iter().any(|&b| self.token(b) == self.token(c)) {
                        return Err(SamplingError::ShapeMismatch(format!(
                            "node {c} repeats a sibling's token {} though children are drawn without replacement",
                            self.token(c)
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The result of verifying a tree.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeOutcome {
    /// The accepted nodes from the root's child down.
    pub path: Vec<usize>,
    /// Their tokens, then the one token every round ends with.
    pub tokens: Vec<u32>,
    pub emitted_from: EmittedFrom,
}

impl TreeOutcome {
    /// Candidates accepted.
    pub fn accepted(&self) -> usize {
        self.path.len()
    }
}

/// What the rule needs at one node with children: the running residual p′ and q′.
pub(crate) trait Running {
    /// p′(x) / q′(x) for a token drawn from q′.
    fn ratio(&self, token: u32) -> f64;
    /// After rejecting `token`: p′ ← norm(max(p′ − q′, 0)), and q′ loses `token` when the
    /// children are drawn without replacement.
    fn reject(&mut self, token: u32, draws: ChildDraws);
    /// A draw from p′ with the stream's uniforms.
    fn draw(&self, stream: crate::rng::StreamKey) -> Result<(u32, EmittedFrom)>;
}

/// What a rejection does to p′: the exact rule takes the rejected child's mass off
/// ([`OnReject::Residual`]); [`crate::naive`] keeps a wrong rule that does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnReject {
    Residual,
    KeepTarget,
}

/// Dense p′ and q′.
pub(crate) struct DenseRunning {
    pub(crate) p: Vec<f64>,
    q: Vec<f64>,
    on_reject: OnReject,
}

impl DenseRunning {
    /// The exact rule's p′ and q′ at a node, before its first child.
    pub(crate) fn exact(p: Vec<f64>, q: Vec<f64>) -> Self {
        Self { p, q, on_reject: OnReject::Residual }
    }
}

impl Running for DenseRunning {
    fn ratio(&self, token: u32) -> f64 {
        self.p[token as usize] / self.q[token as usize]
    }

    fn reject(&mut self, token: u32, draws: ChildDraws) {
        let excess: Vec<f64> = self.p.iter().zip(&self.q).map(|(p, q)| (p - q).max(0.0)).collect();
        let mass: f64 = excess.iter().sum();
        // No mass left means p′ = q′ up to rounding, and the rejection had probability at
        // most the rounding error: p′ is kept.
        if mass > 0.0 && self.on_reject == OnReject::Residual {
            self.p = excess.iter().map(|e| e / mass).collect();
        }
        if draws == ChildDraws::WithoutReplacement {
            self.q[token as usize] = 0.0;
            let left: f64 = self.q.iter().sum();
            if left > 0.0 {
                self.q.iter_mut().for_each(|q| *q /= left);
            }
        }
    }

    fn draw(&self, stream: crate::rng::StreamKey) -> Result<(u32, EmittedFrom)> {
        let weights = self.p.iter().enumerate().map(|(t, &w)| (t as u32, w));
        let token = sample_weights(weights, self.p.iter().sum(), stream.uniform())
            .ok_or_else(|| SamplingError::InvalidTargetReply("the residual has no mass".into()))?;
        Ok((token, EmittedFrom::Residual))
    }
}

/// p′ on the draft's support S with its mass outside, and q′ on S. Outside S, q′ is 0 at
/// every step, so p′ stays proportional to p there and the target's complement sample is an
/// exact draw of that part.
struct SparseRunning<'a> {
    tokens: &'a [u32],
    p: Vec<f64>,
    outside: f64,
    q: Vec<f64>,
    complement_sample: Option<u32>,
    node: usize,
}

impl SparseRunning<'_> {
    fn index(&self, token: u32) -> Option<usize> {
        self.tokens.iter().position(|&t| t == token)
    }
}

impl Running for SparseRunning<'_> {
    fn ratio(&self, token: u32) -> f64 {
        self.index(token).map_or(0.0, |i| self.p[i] / self.q[i])
    }

    fn reject(&mut self, token: u32, draws: ChildDraws) {
        let excess: Vec<f64> = self.p.iter().zip(&self.q).map(|(p, q)| (p - q).max(0.0)).collect();
        let mass = excess.iter().sum::<f64>() + self.outside;
        if mass > 0.0 {
            self.p = excess.iter().map(|e| e / mass).collect();
            self.outside /= mass;
        }
        if draws == ChildDraws::WithoutReplacement
            && let Some(i) = self.index(token)
        {
            self.q[i] = 0.0;
            let left: f64 = self.q.iter().sum();
            if left > 0.0 {
                self.q.iter_mut().for_each(|q| *q /= left);
            }
        }
    }

    fn draw(&self, stream: crate::rng::StreamKey) -> Result<(u32, EmittedFrom)> {
        let mut stream = stream.stream();
        let inside: f64 = self.p.iter().sum();
        if stream.next_uniform() * (inside + self.outside) < inside {
            let weights = self.tokens.iter().copied().zip(self.p.iter().copied());
            let token = sample_weights(weights, inside, stream.next_uniform()).expect("inside > 0 here");
            return Ok((token, EmittedFrom::Residual));
        }
        self.complement_sample
            .map(|t| (t, EmittedFrom::Complement))
            .ok_or(SamplingError::MissingComplementSample { position: self.node + 1, mass: self.outside })
    }
}

/// The loop of the module's rule; `running(u)` starts p′ and q′ at node u with children,
/// `bonus(u)` is the target's draw from p_u at a leaf.
fn verify_tree<R: Running>(
    tree: &DraftTree,
    draws: ChildDraws,
    key: impl DrawKeys,
    running: impl Fn(usize) -> Result<R>,
    bonus: impl Fn(usize) -> Result<u32>,
) -> Result<TreeOutcome> {
    tree.validate(draws)?;
    let (mut node, mut path, mut tokens) = (0, Vec::new(), Vec::new());
    'descend: loop {
        let children = tree.children(node);
        if children.is_empty() {
            tokens.push(bonus(node)?);
            return Ok(TreeOutcome { path, tokens, emitted_from: EmittedFrom::Bonus });
        }
        let mut at = running(node)?;
        for &child in &children {
            let token = tree.token(child);
            if key.stream(child, Purpose::Accept).uniform() < at.ratio(token).min(1.0) {
                path.push(child);
                tokens.push(token);
                node = child;
                continue 'descend;
            }
            at.reject(token, draws);
        }
        let (token, from) = at.draw(key.stream(node + 1, Purpose::Residual))?;
        tokens.push(token);
        return Ok(TreeOutcome { path, tokens, emitted_from: from });
    }
}

/// Tree verification on full distributions: `q[u]` is the q node u's children were drawn
/// from (`None` at a leaf), `p[u]` the target's distribution after node u, for every node.
pub fn verify_tree_dense(
    tree: &DraftTree,
    q: &[Option<DenseDist>],
    p: &[DenseDist],
    draws: ChildDraws,
    key: impl DrawKeys,
) -> Result<TreeOutcome> {
    verify_tree_dense_with(tree, q, p, draws, key, OnReject::Residual)
}

/// [`verify_tree_dense`] with what a rejection does to p′ left to `on_reject`.
pub(crate) fn verify_tree_dense_with(
    tree: &DraftTree,
    q: &[Option<DenseDist>],
    p: &[DenseDist],
    draws: ChildDraws,
    key: impl DrawKeys,
    on_reject: OnReject,
) -> Result<TreeOutcome> {
    if q.len() != tree.len() || p.len() != tree.len() {
        return Err(SamplingError::ShapeMismatch(format!(
            "a tree of {} nodes with {} draft and {} target distributions",
            tree.len(),
            q.len(),
            p.len()
        )));
    }
    check_candidates(tree, |node, token| q[node].as_ref().map(|q| q.prob(token)))?;
    let running = |node: usize| {
        let q = q[node].as_ref().expect("checked: a node with children has its q");
        if q.vocab_size() != p[node].vocab_size() {
            return Err(SamplingError::VocabMismatch { target: p[node].vocab_size(), draft: q.vocab_size() });
        }
        Ok(DenseRunning { p: p[node].probs().to_vec(), q: q.probs().to_vec(), on_reject })
    };
    let bonus = |node: usize| Ok(p[node].sample(key.stream(node + 1, Purpose::Bonus).uniform()));
    verify_tree(tree, draws, key, running, bonus)
}

/// Tree verification on the sparse wire format: `q[u]` is node u's draft support and q on
/// it (`None` at a leaf), `scored[u]` the target's pieces for node u.
pub fn verify_tree_sparse(
    tree: &DraftTree,
    q: &[Option<SparseDist>],
    scored: &[ScoredNode],
    draws: ChildDraws,
    key: impl DrawKeys,
) -> Result<TreeOutcome> {
    if q.len() != tree.len() || scored.len() != tree.len() {
        return Err(SamplingError::ShapeMismatch(format!(
            "a tree of {} nodes with {} draft supports and {} scored nodes",
            tree.len(),
            q.len(),
            scored.len()
        )));
    }
    check_candidates(tree, |node, token| q[node].as_ref().map(|q| q.prob(token)))?;
    let running = |node: usize| {
        let q = q[node].as_ref().expect("checked: a node with children has its q");
        let ScoredNode::Inner(s) = &scored[node] else {
            return Err(SamplingError::InvalidTargetReply(format!(
                "node {node} has children but was scored as a leaf"
            )));
        };
        // The checks a chain's position gets: probabilities, their sum, the complement sample.
        crate::sparse_rule::validate_position(node, q, s)?;
        Ok(SparseRunning {
            tokens: q.tokens(),
            p: s.p_on_support.clone(),
            outside: s.complement_mass,
            q: q.probs().to_vec(),
            complement_sample: s.complement_sample,
            node,
        })
    };
    let vocab_size = q.iter().flatten().map(SparseDist::vocab_size).next();
    let bonus = |node: usize| match &scored[node] {
        ScoredNode::Leaf { bonus } if vocab_size.is_some_and(|v| *bonus as usize >= v) => {
            Err(SamplingError::TokenOutOfRange { token: *bonus, vocab_size: vocab_size.unwrap_or(0) })
        }
        ScoredNode::Leaf { bonus } => Ok(*bonus),
        ScoredNode::Inner(_) => {
            Err(SamplingError::InvalidTargetReply(format!("leaf {node} was scored as a node with children")))
        }
    };
    verify_tree(tree, draws, key, running, bonus)
}

/// Every node with children has its q, and every child's token is possible under it.
fn check_candidates(tree: &DraftTree, q_of: impl Fn(usize, u32) -> Option<f64>) -> Result<()> {
    for child in 1..tree.len() {
        let parent = tree.parents[child - 1];
        match q_of(parent, tree.token(child)) {
            None => {
                return Err(SamplingError::ShapeMismatch(format!(
                    "node {parent} has children but no draft distribution"
                )));
            }
            Some(q) if q <= 0.0 => {
                return Err(SamplingError::ImpossibleProposal { position: child, token: tree.token(child) });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::RoundKey;

    #[test]
    fn a_sparse_reply_with_bad_values_is_refused() {
        use crate::target_pieces::ScoredPosition;
        let key = RoundKey { seed: 1, round: 0 };
        let tree = DraftTree { parents: vec![0], tokens: vec![1] };
        let q = vec![Some(SparseDist::new(4, vec![1], vec![1.0]).unwrap()), None];
        let inner = |p: f64, mass: f64, sample| {
            ScoredNode::Inner(ScoredPosition {
                p_on_support: vec![p],
                complement_mass: mass,
                complement_sample: sample,
            })
        };
        let run = |root: ScoredNode, bonus: u32| {
            verify_tree_sparse(&tree, &q, &[root, ScoredNode::Leaf { bonus }], ChildDraws::WithoutReplacement, key)
        };
        assert!(run(inner(0.4, 0.6, Some(3)), 2).is_ok());
        for (root, bonus) in [
            (inner(0.9, 0.6, Some(3)), 2), // sums to 1.5
            (inner(0.4, 0.6, Some(1)), 2), // complement sample inside the support
            (inner(0.4, 0.6, Some(9)), 2), // complement sample outside the vocabulary
            (inner(1.0, 0.0, None), 4),    // accepted for sure, then a bonus outside the vocabulary
        ] {
            assert!(run(root.clone(), bonus).is_err(), "{root:?}, bonus {bonus}");
        }
    }

    #[test]
    fn refuses_malformed_trees() {
        let p = DenseDist::new(vec![0.5, 0.5]).unwrap();
        let q = Some(p.clone());
        let key = RoundKey { seed: 1, round: 0 };
        let late_parent = DraftTree { parents: vec![1, 0], tokens: vec![0, 1] };
        assert!(
            verify_tree_dense(
                &late_parent,
                &[q.clone(), q.clone(), q.clone()],
                &[p.clone(), p.clone(), p.clone()],
                ChildDraws::WithReplacement,
                key
            )
            .is_err()
        );
        let twins = DraftTree { parents: vec![0, 0], tokens: vec![1, 1] };
        let qs = [q, None, None];
        let ps = [p.clone(), p.clone(), p.clone()];
        assert!(verify_tree_dense(&twins, &qs, &ps, ChildDraws::WithoutReplacement, key).is_err());
        assert!(verify_tree_dense(&twins, &qs, &ps, ChildDraws::WithReplacement, key).is_ok());
        let no_q = [None, None, None];
        assert!(verify_tree_dense(&twins, &no_q, &ps, ChildDraws::WithReplacement, key).is_err());
        let one_hot = Some(DenseDist::one_hot(2, 0).unwrap());
        let impossible = DraftTree::chain(vec![1]);
        assert_eq!(
            verify_tree_dense(&impossible, &[one_hot, None], &[p.clone(), p], ChildDraws::WithReplacement, key),
            Err(SamplingError::ImpossibleProposal { position: 1, token: 1 })
        );
        assert!("forest".parse::<ChildDraws>().is_err());
        for d in ChildDraws::ALL {
            assert_eq!(d.to_string().parse::<ChildDraws>(), Ok(d));
        }
    }
}
