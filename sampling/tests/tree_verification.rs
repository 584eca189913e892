//! Tree verification (recursive rejection sampling over each node's children): its exact
//! law across rounds by enumeration, a chain as the token rule draw for draw, its expected
//! accepted length in closed form against simulation, Monte Carlo audits of the real rule
//! with their power shown against a rule that does not take a rejected child's mass off,
//! and the comparison of rules at equal target positions that docs/rule.md records.

mod common;

use common::{HashedModel, Rule, cell_index, mean_and_error, run_round};
use specd_sampling::chi2::chi_square_test;
use specd_sampling::law::{PrefixModel, WireFormat, expected_accepted, max_law_difference, target_sequence_law};
use specd_sampling::naive::naive_verify_tree_dense;
use specd_sampling::tree_law::{TreeRound, TreeShape, tree_expected_accepted, tree_sequence_law};
use specd_sampling::tree_rule::{ChildDraws, DraftTree, TreeOutcome, verify_tree_dense, verify_tree_sparse};
use specd_sampling::{
    ChildSource, DenseDist, Purpose, RoundKey, SparseDist, StreamKey, Truncation, Verification, draw_children,
    score_tree,
};

const FALSE_FAILURE: f64 = 1e-3;
const TOLERANCE: f64 = 1e-12;

fn sparse() -> WireFormat {
    WireFormat::Sparse(Truncation::new(0.25, 2).unwrap())
}

fn shape(widths: &[usize]) -> TreeShape {
    TreeShape { widths: widths.to_vec() }
}

#[test]
fn the_law_of_tree_rounds_chained_is_the_target_law() {
    let mut checked = 0;
    for seed in 0..24u64 {
        let v = 2 + (seed % 3) as usize;
        let model = HashedModel { seed, vocab_size: v };
        let target = target_sequence_law(&model, &[1], 3);
        for widths in [&[2][..], &[2, 1], &[1, 2], &[3], &[2, 2]] {
            for draws in ChildDraws::ALL {
                for wire in [WireFormat::Dense, sparse()] {
                    let shape = shape(widths);
                    let law = tree_sequence_law(&model, &[1], 3, TreeRound { shape: &shape, draws, wire });
                    let d = max_law_difference(&law, &target);
                    assert!(d <= TOLERANCE, "seed {seed}, V {v}, {widths:?}, {draws}, {wire:?}: off by {d}");
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 480);
}

/// A tree of `shape` drafted after `context` as a draft node would: children drawn one after
/// another with `draw_children` (stream `(Draft, node)`), nodes numbered breadth first.
struct Drafted {
    tree: DraftTree,
    /// Per node: the q its children were drawn from (`None` at a leaf), dense and sparse.
    dense_q: Vec<Option<DenseDist>>,
    sparse_q: Vec<Option<SparseDist>>,
    p: Vec<DenseDist>,
}

fn draft_tree(
    model: &dyn PrefixModel,
    context: &[u32],
    shape: &TreeShape,
    draws: ChildDraws,
    wire: WireFormat,
    key: RoundKey,
) -> Drafted {
    let mut tree = DraftTree { parents: Vec::new(), tokens: Vec::new() };
    let mut prefixes = vec![context.to_vec()];
    let mut depth = vec![0usize];
    let (mut dense_q, mut sparse_q) = (Vec::new(), Vec::new());
    let mut node = 0;
    while node < prefixes.len() {
        let width = shape.widths.get(depth[node]).copied().unwrap_or(0);
        if width == 0 {
            dense_q.push(None);
            sparse_q.push(None);
            node += 1;
            continue;
        }
        let q = model.draft(&prefixes[node]);
        let sparse = match wire {
            WireFormat::Sparse(t) => Some(q.truncate(t)),
            WireFormat::Dense => None,
        };
        let source = match &sparse {
            Some(s) => ChildSource::Sparse(s),
            None => ChildSource::Dense(&q),
        };
        let first_child = tree.tokens.len() + 1;
        for x in draw_children(source, width, draws, key, first_child).unwrap() {
            tree.parents.push(node);
            tree.tokens.push(x);
            prefixes.push([prefixes[node].clone(), vec![x]].concat());
            depth.push(depth[node] + 1);
        }
        dense_q.push(Some(q));
        sparse_q.push(sparse);
        node += 1;
    }
    let p = prefixes.iter().map(|prefix| model.target(prefix)).collect();
    Drafted { tree, dense_q, sparse_q, p }
}

fn tree_round(
    model: &dyn PrefixModel,
    context: &[u32],
    shape: &TreeShape,
    draws: ChildDraws,
    wire: WireFormat,
    key: RoundKey,
    naive: bool,
) -> TreeOutcome {
    let d = draft_tree(model, context, shape, draws, wire, key);
    match wire {
        WireFormat::Dense if naive => naive_verify_tree_dense(&d.tree, &d.dense_q, &d.p, draws, key),
        WireFormat::Dense => verify_tree_dense(&d.tree, &d.dense_q, &d.p, draws, key),
        WireFormat::Sparse(_) => {
            let supports: Vec<Option<&[u32]>> = d.sparse_q.iter().map(|q| q.as_ref().map(SparseDist::tokens)).collect();
            let scored = score_tree(&d.p, &supports, key).unwrap();
            verify_tree_sparse(&d.tree, &d.sparse_q, &scored, draws, key)
        }
    }
    .unwrap()
}

#[test]
fn a_chain_is_token_verification_draw_for_draw() {
    // A chain's draft draws are the token rule's (stream (Draft, i) for node i), and so are
    // the rule's: the same committed tokens, seed for seed.
    let model = HashedModel { seed: 9, vocab_size: 4 };
    let chain = shape(&[1, 1, 1]);
    for seed in 0..2_000 {
        for wire in [WireFormat::Dense, sparse()] {
            let key = RoundKey { seed, round: 2 };
            let tree = tree_round(&model, &[1], &chain, ChildDraws::WithReplacement, wire, key, false);
            let token = run_round(&model, &[1], 0, 3, wire, key, Rule::Exact);
            assert_eq!(tree.tokens, token.tokens, "seed {seed}, {wire:?}");
            assert_eq!(tree.accepted(), token.accepted, "seed {seed}, {wire:?}");
        }
    }
}

#[test]
fn the_closed_form_expected_accepted_length_matches_simulation() {
    // 30 000 rounds per case; 5 standard errors: a false failure about 6e-7 per comparison.
    let n = 30_000;
    for (seed, widths) in [(21u64, &[2, 1][..]), (22, &[3]), (23, &[2, 2])] {
        let model = HashedModel { seed, vocab_size: 4 };
        let shape = shape(widths);
        for draws in ChildDraws::ALL {
            for wire in [WireFormat::Dense, sparse()] {
                let exact = tree_expected_accepted(&model, &[1], TreeRound { shape: &shape, draws, wire });
                let (simulated, error) = mean_and_error(n, |s| {
                    tree_round(&model, &[1], &shape, draws, wire, RoundKey { seed: s, round: 0 }, false).accepted()
                        as f64
                });
                assert!(
                    (simulated - exact).abs() <= 5.0 * error + 1e-9,
                    "{widths:?} {draws} {wire:?}: simulated {simulated} ± {error}, exact {exact}"
                );
            }
        }
    }
}

fn chi2_p_value(
    model: &dyn PrefixModel,
    widths: &[usize],
    draws: ChildDraws,
    wire: WireFormat,
    runs: u64,
    naive: bool,
) -> f64 {
    let (v, length) = (3usize, 3usize);
    let shape = shape(widths);
    let mut counts = vec![0u64; v.pow(length as u32)];
    for seed in 0..runs {
        let mut context = vec![0u32];
        let mut round = 0;
        while context.len() - 1 < length {
            let key = RoundKey { seed, round };
            let outcome = tree_round(model, &context, &shape, draws, wire, key, naive);
            context.extend(&outcome.tokens);
            round += 1;
        }
        counts[cell_index(&context[1..=length], v)] += 1;
    }
    let mut expected = vec![0.0; counts.len()];
    for (seq, prob) in target_sequence_law(model, &[0], length) {
        expected[cell_index(&seq, v)] = prob;
    }
    chi_square_test(&counts, &expected).unwrap().p_value
}

#[test]
fn three_token_law_of_tree_rounds_and_the_rule_that_keeps_rejected_mass_is_caught() {
    // Trees of two levels: three tokens span rounds. The wrong rule tries the next child
    // against p itself; with two children a token both proposed and rejected keeps its chance.
    // On the sparse wire (supports of two of three tokens) the complement sample carries the
    // residual's mass outside the support after every rejected child.
    let model = HashedModel { seed: 2024, vocab_size: 3 };
    for draws in ChildDraws::ALL {
        for wire in [WireFormat::Dense, sparse()] {
            let p = chi2_p_value(&model, &[2, 1], draws, wire, 30_000, false);
            assert!(p > FALSE_FAILURE, "{draws} {wire:?}: p = {p}");
        }
        let wrong = chi2_p_value(&model, &[2, 1], draws, WireFormat::Dense, 30_000, true);
        assert!(wrong < FALSE_FAILURE, "{draws}: the rule that keeps rejected mass passed: p = {wrong}");
    }
}

/// A target with prefix-dependent random rows over `vocab_size` tokens, peaked by raising
/// uniforms to `sharpness`, and a draft that mixes it with its own random rows: `agreement`
/// of the target's mass, so α grows with it.
struct MixedModel {
    seed: u64,
    vocab_size: usize,
    sharpness: i32,
    agreement: f64,
}

impl MixedModel {
    fn row(&self, prefix: &[u32], salt: u32) -> Vec<f64> {
        let h = prefix.iter().fold(self.seed, |h, &t| (h ^ u64::from(t)).wrapping_mul(0x0100_0000_01b3));
        let mut rng = StreamKey::new(h, prefix.len() as u32, salt, Purpose::Plain).stream();
        let w: Vec<f64> = (0..self.vocab_size).map(|_| rng.next_uniform().powi(self.sharpness) + 1e-3).collect();
        let total: f64 = w.iter().sum();
        w.iter().map(|x| x / total).collect()
    }
}

impl PrefixModel for MixedModel {
    fn target(&self, prefix: &[u32]) -> DenseDist {
        DenseDist::new(self.row(prefix, 1)).unwrap()
    }
    fn draft(&self, prefix: &[u32]) -> DenseDist {
        let (p, own) = (self.row(prefix, 1), self.row(prefix, 2));
        DenseDist::from_weights(
            p.iter().zip(&own).map(|(p, o)| self.agreement * p + (1.0 - self.agreement) * o).collect(),
        )
        .unwrap()
    }
}

/// Expected tokens per round (accepted + 1) of each rule with four target positions.
fn rules_at_four_positions(model: &dyn PrefixModel) -> [f64; 6] {
    let tree = |widths: &[usize], draws| {
        let shape = shape(widths);
        assert_eq!(shape.candidates(), 4);
        1.0 + tree_expected_accepted(model, &[1], TreeRound { shape: &shape, draws, wire: WireFormat::Dense })
    };
    [
        1.0 + expected_accepted(model, &[1], 4, WireFormat::Dense, Verification::Token),
        1.0 + expected_accepted(model, &[1], 4, WireFormat::Dense, Verification::Block),
        tree(&[4], ChildDraws::WithReplacement),
        tree(&[4], ChildDraws::WithoutReplacement),
        tree(&[2, 1], ChildDraws::WithReplacement),
        tree(&[2, 1], ChildDraws::WithoutReplacement),
    ]
}

/// A family of models, one per seed.
type ModelOfSeed = Box<dyn Fn(u64) -> Box<dyn PrefixModel>>;

#[test]
fn rules_compared_at_equal_target_positions() {
    // Exact expected tokens per round, averaged over random prefix-dependent tables, every
    // rule given four positions for the target to score. The table is printed for
    // docs/rule.md; the assertion is what the choice of recursive rejection sampling without
    // replacement rests on: it never loses to drawing with replacement on the same shape.
    let names = ["chain token", "chain block", "[4] with", "[4] without", "[2,1] with", "[2,1] without"];
    let regimes: [(&str, ModelOfSeed); 4] = [
        ("hashed V=5", Box::new(|s| Box::new(HashedModel { seed: 1_000 + s, vocab_size: 5 }))),
        (
            "mixed V=6 agreement 0.3",
            Box::new(|s| Box::new(MixedModel { seed: s, vocab_size: 6, sharpness: 3, agreement: 0.3 })),
        ),
        (
            "mixed V=6 agreement 0.6",
            Box::new(|s| Box::new(MixedModel { seed: s, vocab_size: 6, sharpness: 3, agreement: 0.6 })),
        ),
        (
            "mixed V=6 agreement 0.9",
            Box::new(|s| Box::new(MixedModel { seed: s, vocab_size: 6, sharpness: 3, agreement: 0.9 })),
        ),
    ];
    let cases = 40u64;
    for (regime, model) in regimes {
        let mut sums = [0.0f64; 6];
        for seed in 0..cases {
            let row = rules_at_four_positions(model(seed).as_ref());
            assert!(row[3] >= row[2] - 1e-9 && row[5] >= row[4] - 1e-9, "{regime}, seed {seed}: {row:?}");
            for (s, x) in sums.iter_mut().zip(row) {
                *s += x / cases as f64;
            }
        }
        let cells: Vec<String> = names.iter().zip(sums).map(|(n, s)| format!("{n} {s:.3}")).collect();
        eprintln!("{regime}: {}", cells.join(", "));
    }
}
