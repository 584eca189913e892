//! The flags every node role shares (device, dtype, engine, KV budget, batching, threads) and
//! the [`NodeConfig`] they make.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use specd_model::{
    AttentionKernel, AttentionOptions, BatchPolicy, DType, DeviceSpec, Engine, KeyLengths, KvBudget, PrefixCacheOptions,
};
use specd_node::{Distributions, NodeConfig};
use specd_proto::tls::ServerTls;

use super::flag_values::{
    parse_attention_kernel, parse_device, parse_dtype, parse_engine, parse_key_lengths, parse_on_off,
};
use crate::cli_error::invalid;

/// Options every node role shares.
#[derive(Debug, Clone, Args)]
pub struct NodeOptions {
    /// cpu or cuda:N.
    #[arg(long, env = "SPECD_DEVICE", default_value = "cpu", value_parser = parse_device)]
    pub(super) device: DeviceSpec,
    /// auto, f32, f16, bf16 or f64 (f64: slow, for exact greedy identity checks). auto: the
    /// checkpoint's own dtype on a GPU; on a CPU, libtorch takes bf16 where it has bf16
    /// matrix units (AMX), f32 elsewhere, and the host engine bf16 for a bf16 checkpoint; a
    /// draft on a CPU with AVX-512 BF16 takes bf16 (not on libtorch): its q sets the
    /// acceptance rate, not the output law.
    #[arg(long, env = "SPECD_DTYPE", default_value = "auto", value_parser = parse_dtype)]
    pub(super) dtype: DType,
    /// What computes the model's passes: libtorch (every family, CPU or GPU), host (Llama,
    /// Mistral, Qwen2, Qwen3 and Gemma 3 checkpoints on the CPU without libtorch: the CPU's
    /// vector instructions on --threads threads, bf16 or f32 weights, f32 arithmetic but for
    /// bf16 weights on a CPU with AVX-512 BF16, which multiply inputs rounded to bf16), or
    /// auto (on a CPU, where both can run the model, each is timed on a few passes at load
    /// and the faster kept; libtorch otherwise).
    #[arg(long, env = "SPECD_ENGINE", default_value = "auto", value_parser = parse_engine)]
    pub(super) engine: Engine,
    /// Load a checkpoint even when it holds tensors the model does not use (a bias its
    /// config.json does not declare, a layer past num_hidden_layers); refused by default,
    /// naming them, since the model would compute something else than the checkpoint.
    #[arg(long, env = "SPECD_ALLOW_UNUSED_WEIGHTS")]
    pub(super) allow_unused_weights: bool,
    /// How many cached positions each attention call of the libtorch engine is given:
    /// exact (the session's length), N (rounded up to a multiple of N, the rest masked out),
    /// or auto (256 on CUDA, exact on a CPU). A GPU's attention kernels build a plan per
    /// shape, which exact lengths would change at every step; a CPU builds none.
    #[arg(long, env = "SPECD_ATTENTION_KEYS", default_value = "auto", value_parser = parse_key_lengths)]
    pub(super) attention_keys: KeyLengths,
    /// Which attention kernel the libtorch engine asks for: sdpa (libtorch picks one per
    /// call: cuDNN, flash or memory-efficient on CUDA, flash on a CPU), efficient (the
    /// memory-efficient CUDA kernel, called directly: it never uses cuDNN; CUDA only), or
    /// auto (sdpa). Where libtorch would fall to its slow math kernel for a masked block of
    /// a grouped-query model, the KV heads are repeated first, so it does not.
    #[arg(long, env = "SPECD_ATTENTION_KERNEL", default_value = "auto", value_parser = parse_attention_kernel)]
    pub(super) attention_kernel: AttentionKernel,
    /// Sessions a node holds at once; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "SPECD_MAX_SESSIONS", default_value_t = 256)]
    pub(super) max_sessions: usize,
    /// KV-cache budget of a node in MiB (all sessions together); overrides
    /// --kv-memory-fraction.
    #[arg(long, env = "SPECD_KV_BUDGET_MIB")]
    pub(super) kv_budget_mib: Option<u64>,
    /// KV-cache budget of a node as a fraction of the memory free once its model is loaded
    /// and warmed up (like vLLM's --gpu-memory-utilization): on CUDA from the CUDA runtime
    /// (nvidia-smi where it cannot be asked), on a CPU MemAvailable. A session reserves what
    /// its request can reach; one that does not fit is refused with RESOURCE_EXHAUSTED.
    /// `specd up` and `specd bench` split one device's budget between their two nodes;
    /// separate node processes on one device each take their fraction of what is free.
    #[arg(long, env = "SPECD_KV_MEMORY_FRACTION", default_value_t = 0.9)]
    pub(super) kv_memory_fraction: f64,
    /// Milliseconds added to every forward pass of this node's model: stands in for a slower
    /// (bigger) model in benchmarks and tests. 0 in service.
    #[arg(long, env = "SPECD_FORWARD_DELAY_MS", default_value_t = 0.0)]
    pub(super) forward_delay_ms: f64,
    /// Seconds after which a session nobody used is released (its coordinator died without
    /// releasing it); 0 keeps sessions until released.
    #[arg(long, env = "SPECD_SESSION_TTL_S", default_value_t = 600.0)]
    pub(super) session_ttl_s: f64,
    /// Threads of the model, libtorch's or the host engine's (default: one per core). 1
    /// suits small draft models: their operations are too short to split, and on a busy
    /// machine waiting for a second thread costs more than it saves.
    #[arg(long, env = "SPECD_THREADS")]
    pub(super) threads: Option<usize>,
    /// Threads a target uses after each verify pass to turn the block's rows of logits into
    /// distributions and score them, where the work is large enough to split (about 64 Ki
    /// logits a thread: the 6 rows of γ = 5 take 2 threads from a vocabulary of about
    /// 22 000). Default: 1 on a CPU, whose cores the model's threads use (and where they are
    /// pinned, threads started from the model's share its CPU), and up to 4 with a GPU.
    #[arg(long, env = "SPECD_SAMPLING_THREADS")]
    pub(super) sampling_threads: Option<usize>,
    /// Where a node turns logits into distributions: `device` builds them with libtorch on
    /// the model's device and copies only the few numbers the sparse reply carries (about
    /// 500 bytes a verify, not every row: 3 MB at a vocabulary of 128 256); `host` copies
    /// the rows and builds them on the CPU. `auto`: device with a GPU, host on a CPU (where
    /// it measured faster). Dense replies and requests for log-probabilities are built on
    /// the host either way.
    #[arg(long, env = "SPECD_DISTRIBUTIONS", default_value = "auto")]
    pub(super) distributions: Distributions,
    /// Give a CPU model's two threads one CPU each, where the process may run on exactly two
    /// CPUs and no OMP_PROC_BIND, OMP_PLACES or GOMP_CPU_AFFINITY is set. Without it, Linux
    /// now and then puts both on one CPU beside an idle one, and a pass takes twice as long
    /// (BENCHMARKS.md). Larger teams are never pinned (model/src/pinning.rs says why).
    #[arg(long, env = "SPECD_PIN_THREADS", default_value_t = true, action = clap::ArgAction::Set)]
    pub(super) pin_threads: bool,
    /// Most sessions whose forward passes share one pass of the model (batching across
    /// sessions: their tokens go through the weights together, each attends to its own
    /// cache). 1 turns batching off.
    #[arg(long, env = "SPECD_MAX_BATCH_SEQUENCES", default_value_t = BatchPolicy::default().max_sequences)]
    pub(super) max_batch_sequences: usize,
    /// Most tokens in one batched forward pass (bounds how much long prefills delay the
    /// others); a single request above it still runs, alone.
    #[arg(long, env = "SPECD_MAX_BATCH_TOKENS", default_value_t = BatchPolicy::default().max_tokens)]
    pub(super) max_batch_tokens: usize,
    /// Microseconds to wait for more sessions' forwards after the first of a batch, only
    /// while fewer are gathered than sessions are open (a lone session never waits); 0 takes
    /// only those already waiting.
    #[arg(long, env = "SPECD_BATCH_WINDOW_US", default_value_t = BatchPolicy::default().window.as_micros() as u64)]
    pub(super) batch_window_us: u64,
    /// Keep what ended sessions computed for their committed tokens (the KV of the prompt and
    /// output, never of a rejected candidate), so that a later prompt beginning the same way
    /// (a conversation's next turn, an agent's system prompt) prefills only the rest: on or
    /// off. Kept entries count in the KV budget and are evicted, least recently used first,
    /// whenever a live session needs the room; requests share them only under the same
    /// `cache_salt`.
    #[arg(long, env = "SPECD_PREFIX_CACHE", default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub(super) prefix_cache: bool,
    /// Shortest prefix the cache keeps or serves, in tokens.
    #[arg(long, env = "SPECD_PREFIX_CACHE_MIN_TOKENS", default_value_t = PrefixCacheOptions::default().min_tokens)]
    pub(super) prefix_cache_min_tokens: usize,
}

impl NodeOptions {
    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    fn kv_budget(&self) -> anyhow::Result<KvBudget> {
        if let Some(mib) = self.kv_budget_mib {
            return Ok(KvBudget::Bytes(mib.saturating_mul(1024 * 1024)));
        }
        if !(self.kv_memory_fraction > 0.0 && self.kv_memory_fraction <= 1.0) {
            return Err(invalid(format!("--kv-memory-fraction {} must be in (0, 1]", self.kv_memory_fraction)));
        }
        Ok(KvBudget::FractionOfFree(self.kv_memory_fraction))
    }

    pub(crate) fn config(&self, model: PathBuf) -> anyhow::Result<NodeConfig> {
        let forward_delay = Duration::try_from_secs_f64(self.forward_delay_ms / 1e3)
            .ok()
            .filter(|d| *d <= Duration::from_secs(60))
            .ok_or_else(|| invalid(format!("--forward-delay-ms {} must be in [0, 60000]", self.forward_delay_ms)))?;
        if self.max_batch_sequences == 0 || self.max_batch_tokens == 0 {
            return Err(invalid(format!(
                "--max-batch-sequences {} and --max-batch-tokens {} must be at least 1",
                self.max_batch_sequences, self.max_batch_tokens
            )));
        }
        if let Some(n) = self.sampling_threads
            && !(1..=64).contains(&n)
        {
            return Err(invalid(format!("--sampling-threads {n} must be between 1 and 64")));
        }
        if self.batch_window_us > 100_000 {
            return Err(invalid(format!("--batch-window-us {} must be at most 100000", self.batch_window_us)));
        }
        let batch = BatchPolicy {
            max_sequences: self.max_batch_sequences,
            max_tokens: self.max_batch_tokens,
            window: Duration::from_micros(self.batch_window_us),
            ..BatchPolicy::default()
        };
        Ok(NodeConfig {
            model,
            device: self.device,
            dtype: self.dtype,
            max_sessions: self.max_sessions,
            prefix_cache: PrefixCacheOptions { enabled: self.prefix_cache, min_tokens: self.prefix_cache_min_tokens },
            kv_budget: self.kv_budget()?,
            forward_delay,
            session_ttl: match Duration::try_from_secs_f64(self.session_ttl_s) {
                Ok(ttl) if ttl.is_zero() => None,
                Ok(ttl) => Some(ttl),
                Err(_) => return Err(invalid(format!("--session-ttl-s {} must be ≥ 0", self.session_ttl_s))),
            },
            tls: ServerTls::default(),
            metrics: None,
            threads: self.threads,
            sampling_threads: self.sampling_threads,
            pin_threads: self.pin_threads,
            allow_unused_weights: self.allow_unused_weights,
            engine: self.engine,
            attention: AttentionOptions {
                keys: self.attention_keys,
                kernel: self.attention_kernel,
                ..AttentionOptions::default()
            },
            distributions: self.distributions,
            faults: Default::default(),
            batch,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::NodeOptions;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        node: NodeOptions,
    }

    fn node(args: &[&str]) -> NodeOptions {
        Flags::try_parse_from(std::iter::once("node").chain(args.iter().copied())).unwrap().node
    }

    #[test]
    fn sampling_threads_are_checked_and_passed_on() {
        let error = node(&["--sampling-threads", "0"]).config("m".into()).unwrap_err().to_string();
        assert!(error.contains("--sampling-threads 0 must be between 1 and 64"), "{error}");
        let four = node(&["--sampling-threads", "4"]);
        assert_eq!(four.config("m".into()).unwrap().sampling_threads, Some(4));
        assert!(four.to_args(None, None).contains(&"--sampling-threads=4".to_owned()));
        assert_eq!(node(&[]).config("m".into()).unwrap().sampling_threads, None);
    }

    #[test]
    fn distributions_are_parsed_and_passed_on() {
        use specd_node::Distributions;
        assert_eq!(node(&[]).config("m".into()).unwrap().distributions, Distributions::Auto);
        let device = node(&["--distributions", "device"]);
        assert_eq!(device.config("m".into()).unwrap().distributions, Distributions::Device);
        assert!(device.to_args(None, None).contains(&"--distributions=device".to_owned()));
        let error = Flags::try_parse_from(["node", "--distributions", "gpu"]).err().map(|e| e.to_string());
        let error = error.expect("--distributions gpu is refused");
        assert!(error.contains("expected auto, host or device"), "{error}");
    }
}
