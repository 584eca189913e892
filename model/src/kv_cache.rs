//! A preallocated per-session KV cache with O(1) truncation.

use tch::{Device, Kind, Tensor};

use crate::error::Result;

/// Keys and values of every layer, `[1, kv_heads, capacity, head_dim]` each, allocated once
/// when the session opens. The valid length is kept by the session table: truncation only
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
