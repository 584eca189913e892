//! A preallocated per-session KV cache with O(1) truncation, grown by reallocation when a
//! session outgrows what it reserved.

use tch::{Device, Kind, Tensor};

use crate::error::Result;

/// Keys and values of every layer, `[1, kv_heads, capacity, head_dim]` each, allocated
/// when the session opens (and again, larger, if it outgrows them: [`KvCache::grow`]). The valid length is kept by the session table: truncation only
/// moves that length back, and later writes overwrite the stale tail in place.
#[derive(Debug)]
pub(crate) struct KvCache {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
}

impl KvCache {
    pub(crate) fn new(
        layers: usize,
        kv_heads: usize,
        capacity: usize,
        head_dim: usize,
        kind: Kind,
        device: Device,
    ) -> Result<Self> {
        let shape = [1, kv_heads as i64, capacity as i64, head_dim as i64];
        let mut keys = Vec::with_capacity(layers);
        let mut values = Vec::with_capacity(layers);
        for _ in 0..layers {
            keys.push(Tensor::f_empty(shape, (kind, device))?);
            values.push(Tensor::f_empty(shape, (kind, device))?);
        }
        Ok(Self { keys, values })
    }

    /// Bytes one session of `capacity` tokens needs.
    pub(crate) fn bytes(layers: usize, kv_heads: usize, capacity: usize, head_dim: usize, elt: u64) -> u64 {
        2 * layers as u64 * kv_heads as u64 * capacity as u64 * head_dim as u64 * elt
    }

    /// Reallocates every layer for `capacity` tokens, keeping the first `len`. All new
    /// tensors are allocated before any old one is replaced, so a failed allocation leaves
    /// the cache as it was.
    pub(crate) fn grow(&mut self, len: usize, capacity: usize) -> Result<()> {
        let mut grown = Vec::with_capacity(self.keys.len() + self.values.len());
        for old in self.keys.iter().chain(&self.values) {
            let mut shape = old.size();
            shape[2] = capacity as i64;
            let new = Tensor::f_empty(shape.as_slice(), (old.kind(), old.device()))?;
            if len > 0 {
                new.f_narrow(2, 0, len as i64)?.f_copy_(&old.f_narrow(2, 0, len as i64)?)?;
            }
            grown.push(new);
        }
        let values = grown.split_off(self.keys.len());
        self.keys = grown;
        self.values = values;
        Ok(())
    }

    /// Writes `k`, `v` (`[1, kv_heads, n, head_dim]`) at positions `pos..pos + n` of `layer`
    /// and returns views of positions `0..pos + n`.
    pub(crate) fn append(&mut self, layer: usize, pos: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let n = k.size()[2];
        let pos = pos as i64;
        let keys = &self.keys[layer];
        let values = &self.values[layer];
        keys.f_narrow(2, pos, n)?.f_copy_(k)?;
        values.f_narrow(2, pos, n)?.f_copy_(v)?;
        Ok((keys.f_narrow(2, 0, pos + n)?, values.f_narrow(2, 0, pos + n)?))
    }
}
