//! What a tree of candidates costs a target against a chain, on each engine: the median
//! pass over `n` positions at context 256 as a chain of `n` tokens (all rows returned, as a
//! verify pass returns them) and as a token tree of `n` nodes of `--tree` shapes, then the
//! kept path, as the target runs them each round. The shapes and the chain alternate, so
//! their ratio holds whatever the host's load does meanwhile.
//!
//! `SPECD_BENCH_MODEL_DIR=$PWD/models/demo/target SPECD_BENCH_THREADS=2 cargo bench -p
//! specd-model --bench tree_pass` (defaults: the shipped demo target, one thread per core,
//! `--dtype auto`, 100 passes of each kind: `SPECD_BENCH_SAMPLES`).

use std::hint::black_box;
use std::time::Instant;

use specd_model::{BoxedModel, Engine, LanguageModel, LoadOptions, SessionId, TokenTree, load_model};

mod common;
use common::{BenchEnv, median};

const CONTEXT: usize = 256;

/// `--tree` widths per depth, as the draft node expands them (depth first).
const SHAPES: [&[usize]; 4] = [&[1, 1, 1, 1], &[2, 2, 1, 1], &[4, 2, 2, 1], &[8, 2, 1, 1]];

/// The tree a shape gives, nodes numbered depth first as the draft node numbers them.
fn tree_of(widths: &[usize], vocab: u32) -> TokenTree {
    fn expand(widths: &[usize], parent: Option<usize>, parents: &mut Vec<Option<usize>>) {
        let Some((&width, deeper)) = widths.split_first() else { return };
        for _ in 0..width {
            parents.push(parent);
            let me = parents.len() - 1;
            expand(deeper, Some(me), parents);
        }
    }
    let mut parents = Vec::new();
    expand(widths, None, &mut parents);
    let tokens = (0..parents.len() as u32).map(|i| (i * 7919 + 3) % vocab).collect();
    TokenTree::new(tokens, parents).expect("a tree")
}

fn main() {
    let BenchEnv { dir, samples, threads, dtype } = BenchEnv::read("target", 100);
    for engine in [Engine::Host, Engine::Libtorch] {
        let opts = LoadOptions { dtype, threads: Some(threads), engine, ..LoadOptions::default() };
        let mut m: BoxedModel = load_model(&dir, &opts).expect("checkpoint");
        let vocab = m.info().vocab_size as u32;
        let s: SessionId = m.open_session(Some(CONTEXT + 128)).expect("session");
        let prompt: Vec<u32> = (0..CONTEXT as u32).map(|i| (i * 7919) % vocab).collect();
        m.forward(s, &prompt).expect("prefill");
        println!("{}: {} engine, weights {}, {threads} thread(s)", dir.display(), m.info().engine, m.info().dtype);
        let one = median((0..samples).map(|_| chain_pass(&mut m, s, &prompt[..1])).collect());
        println!("  1 position (a decode pass): {:.0} µs", one * 1e6);
        for widths in SHAPES {
            let tree = tree_of(widths, vocab);
            let chain: Vec<u32> = tree.tokens().to_vec();
            let (mut as_chain, mut as_tree) = (Vec::new(), Vec::new());
            for _ in 0..samples {
                as_chain.push(chain_pass(&mut m, s, &chain));
                as_tree.push(tree_pass(&mut m, s, &tree));
            }
            let (c, t) = (median(as_chain), median(as_tree));
            println!(
                "  tree {widths:?}, {} positions: as a chain {:.0} µs ({:.2} decode passes), as a tree {:.0} µs \
                 ({:.2}), tree/chain {:.2}",
                tree.len(),
                c * 1e6,
                c / one,
                t * 1e6,
                t / one,
                t / c
            );
        }
    }
}

fn chain_pass(m: &mut BoxedModel, s: SessionId, tokens: &[u32]) -> f64 {
    let start = Instant::now();
    black_box(m.forward_last(s, tokens, tokens.len()).expect("forward"));
    let t = start.elapsed().as_secs_f64();
    m.truncate(s, CONTEXT).expect("truncate");
    t
}

/// A tree pass and the deepest first path kept, as a round keeps its accepted path.
fn tree_pass(m: &mut BoxedModel, s: SessionId, tree: &TokenTree) -> f64 {
    let start = Instant::now();
    black_box(m.forward_tree(s, tree).expect("tree pass"));
    let mut path = vec![0];
    while let Some(child) =
        (path[path.len() - 1] + 1..tree.len()).find(|&n| tree.parent(n) == Some(path[path.len() - 1]))
    {
        path.push(child);
    }
    m.keep_tree_path(s, CONTEXT, tree, &path).expect("keep a path");
    let t = start.elapsed().as_secs_f64();
    m.truncate(s, CONTEXT).expect("truncate");
    t
}
