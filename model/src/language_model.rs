//! The [`LanguageModel`] trait that the draft and target nodes program against.

use tch::{Device, Kind, Tensor};

use crate::error::{ModelError, Result};
use crate::token_tree::TokenTree;

/// Identifies one session (one generation's KV cache) on one model.
pub type SessionId = u64;

/// What a node tells its peers about the model it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// Human-readable name (the checkpoint directory or table file name).
    pub name: String,
    /// The checkpoint class (`LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM`,
    /// `Qwen3ForCausalLM`, `Gemma3ForCausalLM`) or `Table`.
    pub architecture: String,
    /// Number of logits per position (may exceed the tokenizer's vocabulary).
    pub vocab_size: usize,
    /// Token ids that end a generation (from `generation_config.json`, else `config.json`).
    pub eos_token_ids: Vec<u32>,
    /// Beginning-of-sequence token, when the checkpoint declares one.
    pub bos_token_id: Option<u32>,
    /// Longest sequence the model supports (`max_position_embeddings`).
    pub context_length: usize,
    /// Hash of the tokenizer's vocabulary: two nodes with equal fingerprints map the same
    /// ids to the same strings. See [`crate::tokenizer::TextTokenizer::fingerprint`].
    pub tokenizer_fingerprint: String,
    /// Whether [`LanguageModel::encode`] and [`LanguageModel::decode`] work.
    pub has_tokenizer: bool,
    /// Bytes of KV cache one session needs per token of capacity.
    pub kv_bytes_per_token: u64,
    /// The dtype the weights and caches are kept in (`--dtype auto` resolved; f32 for a
    /// table model, whose probabilities are exact in any case).
    pub dtype: crate::device::DType,
    /// What computes its passes: `libtorch`, `host` ([`crate::host`]) or `table`.
    pub engine: &'static str,
}

/// Logits for a run of positions, `rows × vocab` in `f32`: row-major on the host, or a
/// `[rows, vocab]` tensor where the model computed them.
///
/// Row `i` scores the token that follows input token `i`. A model returns logits on its
/// device only when loaded with [`crate::LoadOptions::logits_on_device`]: a node that builds
/// its distributions there copies a few numbers to the host instead of every row (3 MB a
/// verify at a vocabulary of 128 256). Reading rows needs them on the host
/// ([`Self::into_host`]).
#[derive(Debug)]
pub struct Logits {
    vocab: usize,
    rows: usize,
    storage: Storage,
}

#[derive(Debug)]
enum Storage {
    Host(Vec<f32>),
    Tensor(Tensor),
}

impl Logits {
    /// Wraps row-major data; `data.len()` must be a multiple of `vocab`.
    pub fn new(vocab: usize, data: Vec<f32>) -> Result<Self> {
        if vocab == 0 || !data.len().is_multiple_of(vocab) {
            return Err(ModelError::InvalidInput(format!("{} logits do not form rows of {vocab}", data.len())));
        }
        Ok(Self { vocab, rows: data.len() / vocab, storage: Storage::Host(data) })
    }

    /// Wraps a `[rows, vocab]` tensor of `f32`, on any device, without copying it.
    pub fn from_tensor(tensor: Tensor) -> Result<Self> {
        let (rows, vocab) = match tensor.size()[..] {
            [rows, vocab] if vocab > 0 && rows >= 0 => (rows as usize, vocab as usize),
            ref size => return Err(ModelError::InvalidInput(format!("logits of shape {size:?} are not rows"))),
        };
        let tensor = if tensor.kind() == Kind::Float { tensor } else { tensor.f_to_kind(Kind::Float)? };
        Ok(Self { vocab, rows, storage: Storage::Tensor(tensor) })
    }

    /// Number of positions.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of logits per position.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Whether the rows are on the host (readable with [`Self::row`]).
    pub fn on_host(&self) -> bool {
        matches!(self.storage, Storage::Host(_))
    }

    /// The same logits on the host: copied from their tensor (the whole run), or as they are.
    pub fn into_host(self) -> Result<Self> {
        match self.storage {
            Storage::Host(_) => Ok(self),
            Storage::Tensor(tensor) => {
                let tensor = tensor.f_to_device(Device::Cpu)?.f_contiguous()?;
                let mut data = vec![0f32; self.rows * self.vocab];
                tensor.f_copy_data(&mut data, self.rows * self.vocab)?;
                Self::new(self.vocab, data)
            }
        }
    }

    /// The logits as a `[rows, vocab]` `f32` tensor: their own (shared, not copied), or a CPU
    /// tensor made from the host rows.
    pub fn tensor(&self) -> Result<Tensor> {
        match &self.storage {
            Storage::Tensor(tensor) => Ok(tensor.shallow_clone()),
            Storage::Host(data) => Ok(Tensor::f_from_slice(data)?.f_view([self.rows as i64, self.vocab as i64])?),
        }
    }

    /// The logits of position `i`; `None` past the end, or while the logits are in a tensor.
    pub fn row(&self, i: usize) -> Option<&[f32]> {
        self.host_data().get(i * self.vocab..(i + 1) * self.vocab)
    }

    /// Iterates over the rows. Panics while the logits are in a tensor ([`Self::into_host`]
    /// first): a caller that read no rows from them would compare or score nothing.
    pub fn iter_rows(&self) -> impl Iterator<Item = &[f32]> {
        self.host_rows().chunks_exact(self.vocab)
    }

    /// All logits, row-major. Panics while the logits are in a tensor, as [`Self::iter_rows`].
    pub fn as_slice(&self) -> &[f32] {
        self.host_rows()
    }

    /// The rows as separate vectors (for JSON output). Panics while the logits are in a
    /// tensor, as [`Self::iter_rows`].
    pub fn to_rows(&self) -> Vec<Vec<f32>> {
        self.iter_rows().map(<[f32]>::to_vec).collect()
    }

    /// Only the last `rows` rows (all of them when there are fewer).
    pub fn last_rows(self, rows: usize) -> Result<Self> {
        let drop = self.rows.saturating_sub(rows);
        let keep = self.rows - drop;
        let storage = match self.storage {
            Storage::Host(mut data) => {
                data.drain(..drop * self.vocab);
                Storage::Host(data)
            }
            Storage::Tensor(tensor) => Storage::Tensor(tensor.f_narrow(0, drop as i64, keep as i64)?),
        };
        Ok(Self { vocab: self.vocab, rows: keep, storage })
    }

    fn host_data(&self) -> &[f32] {
        match &self.storage {
            Storage::Host(data) => data,
            Storage::Tensor(_) => &[],
        }
    }

    fn host_rows(&self) -> &[f32] {
        assert!(self.on_host(), "logits in a tensor are read on the host after into_host()");
        self.host_data()
    }
}

impl Clone for Logits {
    fn clone(&self) -> Self {
        let storage = match &self.storage {
            Storage::Host(data) => Storage::Host(data.clone()),
            // Logits are never changed in place: sharing the tensor is a copy.
            Storage::Tensor(tensor) => Storage::Tensor(tensor.shallow_clone()),
        };
        Self { vocab: self.vocab, rows: self.rows, storage }
    }
}

/// Equal shapes and equal numbers; logits in a tensor are compared as a tensor.
impl PartialEq for Logits {
    fn eq(&self, other: &Self) -> bool {
        if (self.rows, self.vocab) != (other.rows, other.vocab) {
            return false;
        }
        match (&self.storage, &other.storage) {
            (Storage::Host(a), Storage::Host(b)) => a == b,
            _ => match (self.tensor(), other.tensor()) {
                (Ok(a), Ok(b)) => a.to_device(Device::Cpu).equal(&b.to_device(Device::Cpu)),
                _ => false,
            },
        }
    }
}

/// A session to open for a prompt ([`LanguageModel::open_with_prefix`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixRequest<'a> {
    /// The tokens the session will hold first (the prompt, and output already committed).
    pub tokens: &'a [u32],
    /// Cached prefixes are shared only between requests with the same salt (vLLM's
    /// `cache_salt`): tenants cannot time each other's prompts.
    pub salt: &'a str,
    /// As [`LanguageModel::open_session`]'s.
    pub capacity: Option<usize>,
}

/// A session opened by [`LanguageModel::open_with_prefix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenedSession {
    pub session: SessionId,
    /// How many of the request's first tokens the session's cache holds already (0 on a
    /// miss); never all of them, so that a pass over the rest scores the next token.
    pub reused: usize,
}

/// What a prefix cache has done since the model loaded, and what it holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub lookups: u64,
    pub hits: u64,
    /// Prompt tokens served from the cache, over all hits.
    pub hit_tokens: u64,
    /// Entries dropped to make room for live sessions.
    pub evictions: u64,
    pub entries: usize,
    pub tokens: usize,
    /// KV bytes the entries hold (counted in the node's budget, and given back first).
    pub bytes: u64,
}

/// One sequence's part of a forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardItem<'a> {
    pub session: SessionId,
    /// Appended to the session.
    pub tokens: &'a [u32],
    /// Logits come back for the last `rows` of `tokens` only (all of them when there are
    /// fewer; at least one). A node reads the rows after its last pending token: one after a
    /// prompt, the block's γ + 1 in a verify pass.
    pub rows: usize,
}

impl<'a> ForwardItem<'a> {
    /// Every row: what [`LanguageModel::forward`] returns.
    pub fn every_row(session: SessionId, tokens: &'a [u32]) -> Self {
        Self { session, tokens, rows: tokens.len() }
    }
}

/// A causal language model with per-session KV caches.
///
/// A session's cache covers a prefix of its token sequence. `forward` appends tokens and
/// returns logits for **every** appended position, so one call scores a whole speculative
/// block; `truncate` rolls the cache back to a committed length in O(1).
///
/// Implementations are not required to be `Sync`: they live on one worker thread
/// ([`crate::worker::ModelWorker`]) that owns the weights and every session's cache.
pub trait LanguageModel {
    /// Static facts about the model.
    fn info(&self) -> &ModelInfo;

    /// Opens a session whose cache holds up to `capacity` tokens (default: the context
    /// length). Fails with [`ModelError::MemoryBudget`] when the node's budget is exhausted.
    fn open_session(&mut self, capacity: Option<usize>) -> Result<SessionId>;

    /// Number of tokens the session's cache holds.
    fn session_len(&self, session: SessionId) -> Result<usize>;

    /// Opens a session whose cache starts as a copy of the first `len` tokens of `source`'s
    /// (a prefix another session computed), reserving `capacity` tokens as
    /// [`Self::open_session`] does; the two then truncate and grow apart. The default, for a
    /// backend that cannot copy a cache, refuses.
    fn fork_session(&mut self, source: SessionId, len: usize, capacity: Option<usize>) -> Result<SessionId> {
        let _ = (source, len, capacity);
        Err(ModelError::InvalidInput(format!("{} cannot copy a session's cache", self.info().name)))
    }

    /// Raises the session's reservation to `capacity` tokens where it holds fewer, admitted
    /// against the budget as a new session would be: a session taken over from the prefix
    /// cache reserves what its new request can reach before any pass runs. The default, for
    /// a backend that grows its sessions as they need, does nothing.
    fn reserve(&mut self, session: SessionId, capacity: usize) -> Result<()> {
        let _ = (session, capacity);
        Ok(())
    }

    /// Opens a session for `request.tokens`, starting from the longest prefix of them that
    /// the prefix cache holds ([`crate::prefix_cache`]) where the model has one. The default,
    /// without a cache, opens an empty session.
    fn open_with_prefix(&mut self, request: &PrefixRequest<'_>) -> Result<OpenedSession> {
        Ok(OpenedSession { session: self.open_session(request.capacity)?, reused: 0 })
    }

    /// Ends a session whose cache's first `committed.len()` rows are the committed tokens
    /// `committed`: the prefix cache keeps them for later sessions with the same `salt`,
    /// where the model has one. The default releases the session.
    fn retire(&mut self, session: SessionId, salt: &str, committed: &[u32]) -> Result<()> {
        let _ = (salt, committed);
        self.release(session)
    }

    /// What the prefix cache has done so far; `None` without one.
    fn prefix_cache_stats(&self) -> Option<PrefixCacheStats> {
        None
    }

    /// Appends `tokens` to the session and returns one row of logits per token.
    ///
    /// On error the session keeps its previous length.
    fn forward(&mut self, session: SessionId, tokens: &[u32]) -> Result<Logits>;

    /// [`Self::forward`], returning the logits of the last `rows` tokens only (see
    /// [`ForwardItem::rows`]). A backend that can skips the head for the other rows: over a
    /// prompt of n tokens and a vocabulary of V, that is n·V logits computed, converted and
    /// copied for one row's use. The default computes every row and keeps the last.
    fn forward_last(&mut self, session: SessionId, tokens: &[u32], rows: usize) -> Result<Logits> {
        let logits = self.forward(session, tokens)?;
        let keep = rows_returned(rows, logits.rows());
        logits.last_rows(keep)
    }

    /// Appends each item's tokens to its session in **one** forward pass where the backend
    /// can (a ragged batch: every sequence's tokens share the projections and the MLP, each
    /// attends to its own cache), and returns each item's logits as [`Self::forward_last`]
    /// would, within floating-point tolerance. Items fail one by one: a bad item does not fail
    /// the others. Sessions must be distinct. The default runs the items one after another.
    fn forward_batch(&mut self, items: &[ForwardItem<'_>]) -> Vec<Result<Logits>> {
        items.iter().map(|item| self.forward_last(item.session, item.tokens, item.rows)).collect()
    }

    /// Scores every node of `tree` as if appended after the session's tokens: row `i`
    /// scores the token after node `i`, which attends to the session's tokens and to its
    /// own ancestors, at position `len + depth(i)`. Rows equal those of forwarding each
    /// node's path alone, within floating-point tolerance. Afterwards the session's tokens
    /// past its length before the call are not valid until [`Self::keep_tree_path`] keeps
    /// one path (or [`Self::truncate`] drops them all).
    ///
    /// The default forwards each node's path in turn (exact for any model, one pass a node);
    /// a backend that can scores the whole tree in one pass with a tree mask.
    fn forward_tree(&mut self, session: SessionId, tree: &TokenTree) -> Result<Logits> {
        let base = self.session_len(session)?;
        let mut data = Vec::new();
        let mut vocab = 0;
        for node in 0..tree.len() {
            self.truncate(session, base)?;
            let row = self.forward_last(session, &tree.path_tokens(&tree.path_to(node)), 1)?.into_host()?;
            vocab = row.vocab();
            data.extend_from_slice(row.as_slice());
        }
        self.truncate(session, base)?;
        Logits::new(vocab, data)
    }

    /// After [`Self::forward_tree`] of `tree` at length `base`, keeps the nodes of `path`
    /// (from a root down, each the child of the one before; empty keeps none): the session
    /// then holds `base + path.len()` tokens, its cache as if the path had been forwarded
    /// alone. The default truncates to `base` and forwards the path again.
    fn keep_tree_path(&mut self, session: SessionId, base: usize, tree: &TokenTree, path: &[usize]) -> Result<()> {
        tree.check_path(path)?;
        self.truncate(session, base)?;
        if !path.is_empty() {
            self.forward_last(session, &tree.path_tokens(path), 1)?;
        }
        Ok(())
    }

    /// How many sequences shared the last forward pass this caller made (1 when forwards
    /// are not batched); read by nodes to report their mean batch size.
    fn last_batch_size(&self) -> usize {
        1
    }

    /// Builds, before the first request, what the backend builds the first time it sees a
    /// pass of 1 to `max_tokens` tokens, and returns how many passes that took (0: nothing
    /// to build). Nodes call it at start so that the first verify pass of each block length
    /// does not pay for it, and does not teach adaptive γ a cost that never recurs.
    fn warm_up(&mut self, _max_tokens: usize) -> Result<usize> {
        Ok(0)
    }

    /// Bounds the bytes of KV cache all sessions may hold together from now on (`None`:
    /// unbounded); sessions open already count against it. A node sets it right after
    /// [`Self::warm_up`], when a fraction of the free memory can be measured
    /// ([`crate::KvBudget::resolve`]); until then a model holds what its load options fix
    /// without measuring ([`crate::KvBudget::without_measuring`]). The default, for a model
    /// that does not account for its sessions' memory, takes only `None`.
    fn set_memory_budget(&mut self, budget: Option<u64>) -> Result<()> {
        match budget {
            None => Ok(()),
            Some(bytes) => Err(ModelError::InvalidInput(format!(
                "{} does not account for its sessions' memory, so it cannot keep a budget of {bytes} bytes",
                self.info().name
            ))),
        }
    }

    /// Shrinks the session to its first `len` tokens (O(1); `len` ≤ current length).
    fn truncate(&mut self, session: SessionId, len: usize) -> Result<()>;

    /// Drops the session and frees its cache.
    fn release(&mut self, session: SessionId) -> Result<()>;

    /// Bytes of cache held by open sessions, and the budget (if any).
    fn memory_in_use(&self) -> (u64, Option<u64>);

    /// Sessions open now (0 when the backend does not count them). The batching worker
    /// waits for more forwards only while fewer than this many are gathered.
    fn open_sessions(&self) -> usize {
        0
    }

    /// Encodes text with the model's tokenizer, when it has one.
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let _ = text;
        Err(ModelError::InvalidInput(format!("{} has no tokenizer; pass token ids", self.info().name)))
    }

    /// Decodes token ids to text with the model's tokenizer, when it has one.
    fn decode(&self, ids: &[u32]) -> Result<String> {
        let _ = ids;
        Err(ModelError::InvalidInput(format!("{} has no tokenizer to decode with", self.info().name)))
    }
}

/// How many rows a pass over `tokens` tokens returns when `asked` are asked for
/// ([`ForwardItem::rows`]): at least one, at most one per token.
pub(crate) fn rows_returned(asked: usize, tokens: usize) -> usize {
    asked.clamp(1, tokens.max(1))
}

/// Checks token ids against the vocabulary before they reach libtorch.
pub(crate) fn check_tokens(tokens: &[u32], vocab: usize) -> Result<()> {
    if tokens.is_empty() {
        return Err(ModelError::InvalidInput("no tokens to forward".into()));
    }
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ModelError::InvalidInput(format!("token id {bad} is outside the vocabulary of {vocab}")));
    }
    Ok(())
}

/// Checks what [`LanguageModel::keep_tree_path`] is given: `path` one of `tree`'s, and
/// `session`, which holds `held` tokens, the `base` before the tree and the tree's nodes (a
/// [`LanguageModel::forward_tree`] came before).
pub(crate) fn check_tree_keep(
    session: SessionId,
    held: usize,
    base: usize,
    tree: &TokenTree,
    path: &[usize],
) -> Result<()> {
    tree.check_path(path)?;
    if held != base + tree.len() {
        return Err(ModelError::InvalidInput(format!(
            "session {session} holds {held} tokens, not the {base} before a tree of {} nodes and the tree: \
             keep_tree_path follows forward_tree",
            tree.len()
        )));
    }
    Ok(())
}

impl<T: LanguageModel + ?Sized> LanguageModel for Box<T> {
    fn info(&self) -> &ModelInfo {
        (**self).info()
    }
    fn open_session(&mut self, capacity: Option<usize>) -> Result<SessionId> {
        (**self).open_session(capacity)
    }
    fn session_len(&self, session: SessionId) -> Result<usize> {
        (**self).session_len(session)
    }
    fn fork_session(&mut self, source: SessionId, len: usize, capacity: Option<usize>) -> Result<SessionId> {
        (**self).fork_session(source, len, capacity)
    }
    fn reserve(&mut self, session: SessionId, capacity: usize) -> Result<()> {
        (**self).reserve(session, capacity)
    }
    fn open_with_prefix(&mut self, request: &PrefixRequest<'_>) -> Result<OpenedSession> {
        (**self).open_with_prefix(request)
    }
    fn retire(&mut self, session: SessionId, salt: &str, committed: &[u32]) -> Result<()> {
        (**self).retire(session, salt, committed)
    }
    fn prefix_cache_stats(&self) -> Option<PrefixCacheStats> {
        (**self).prefix_cache_stats()
    }
    fn forward(&mut self, session: SessionId, tokens: &[u32]) -> Result<Logits> {
        (**self).forward(session, tokens)
    }
    fn forward_last(&mut self, session: SessionId, tokens: &[u32], rows: usize) -> Result<Logits> {
        (**self).forward_last(session, tokens, rows)
    }
    fn forward_batch(&mut self, items: &[ForwardItem<'_>]) -> Vec<Result<Logits>> {
        (**self).forward_batch(items)
    }
    fn forward_tree(&mut self, session: SessionId, tree: &TokenTree) -> Result<Logits> {
        (**self).forward_tree(session, tree)
    }
    fn keep_tree_path(&mut self, session: SessionId, base: usize, tree: &TokenTree, path: &[usize]) -> Result<()> {
        (**self).keep_tree_path(session, base, tree, path)
    }
    fn last_batch_size(&self) -> usize {
        (**self).last_batch_size()
    }
    fn warm_up(&mut self, max_tokens: usize) -> Result<usize> {
        (**self).warm_up(max_tokens)
    }
    fn set_memory_budget(&mut self, budget: Option<u64>) -> Result<()> {
        (**self).set_memory_budget(budget)
    }
    fn truncate(&mut self, session: SessionId, len: usize) -> Result<()> {
        (**self).truncate(session, len)
    }
    fn release(&mut self, session: SessionId) -> Result<()> {
        (**self).release(session)
    }
    fn memory_in_use(&self) -> (u64, Option<u64>) {
        (**self).memory_in_use()
    }
    fn open_sessions(&self) -> usize {
        (**self).open_sessions()
    }
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        (**self).encode(text)
    }
    fn decode(&self, ids: &[u32]) -> Result<String> {
        (**self).decode(ids)
    }
}
