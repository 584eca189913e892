//! A preallocated per-session KV cache with O(1) truncation, grown by reallocation when a
//! session outgrows what it reserved.

use tch::{Device, Kind, Tensor};

use crate::error::Result;

/// Keys and values of every layer, `[1, capacity, kv_heads, head_dim]` each, allocated
/// when the session opens (and again, larger, if it outgrows them: [`KvCache::grow`]). The
/// valid length is kept by the session table: truncation only moves that length back, and
/// later writes overwrite the stale tail in place.
///
/// Positions are the outer dimension so that a view of the first `L` positions has the same
/// strides whatever the capacity: a GPU kernel that keys its plans on strides then sees one
/// layout for every session, and a run's rows are written as one contiguous block.
#[derive(Debug)]
pub(crate) struct KvCache {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    /// Whether unwritten positions hold zeros: attention over bucketed key lengths reads
    /// positions past the session's length (masked out), and uninitialised memory there
    /// could hold NaN, which a zero weight does not cancel.
    zeroed: bool,
}

impl KvCache {
    pub(crate) fn new(
        layers: usize,
        kv_heads: usize,
        capacity: usize,
        head_dim: usize,
        kind: Kind,
        device: Device,
        zeroed: bool,
    ) -> Result<Self> {
        let shape = [1, capacity as i64, kv_heads as i64, head_dim as i64];
        let mut keys = Vec::with_capacity(layers);
        let mut values = Vec::with_capacity(layers);
        for _ in 0..layers {
            keys.push(allocate(&shape, kind, device, zeroed)?);
            values.push(allocate(&shape, kind, device, zeroed)?);
        }
        Ok(Self { keys, values, zeroed })
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
            shape[1] = capacity as i64;
            let new = allocate(&shape, old.kind(), old.device(), self.zeroed)?;
            if len > 0 {
                new.f_narrow(1, 0, len as i64)?.f_copy_(&old.f_narrow(1, 0, len as i64)?)?;
            }
            grown.push(new);
        }
        let values = grown.split_off(self.keys.len());
        self.keys = grown;
        self.values = values;
        Ok(())
    }

    /// A new cache of `capacity` tokens holding a copy of this one's first `len` (a prefix
    /// another session computed, which both then use apart).
    pub(crate) fn copy_prefix(&self, len: usize, capacity: usize) -> Result<Self> {
        let copy = |old: &Tensor| -> Result<Tensor> {
            let mut shape = old.size();
            shape[1] = capacity as i64;
            let new = allocate(&shape, old.kind(), old.device(), self.zeroed)?;
            if len > 0 {
                new.f_narrow(1, 0, len as i64)?.f_copy_(&old.f_narrow(1, 0, len as i64)?)?;
            }
            Ok(new)
        };
        let keys = self.keys.iter().map(copy).collect::<Result<Vec<_>>>()?;
        let values = self.values.iter().map(copy).collect::<Result<Vec<_>>>()?;
        Ok(Self { keys, values, zeroed: self.zeroed })
    }

    /// Writes `k`, `v` (`[1, n, kv_heads, head_dim]`) at positions `pos..pos + n` of `layer`
    /// and returns views of positions `0..keys` as attention takes them, `[1, kv_heads, keys,
    /// head_dim]`.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        pos: usize,
        k: &Tensor,
        v: &Tensor,
        keys: usize,
    ) -> Result<(Tensor, Tensor)> {
        let n = k.size()[1];
        let pos = pos as i64;
        let (all_keys, all_values) = (&self.keys[layer], &self.values[layer]);
        all_keys.f_narrow(1, pos, n)?.f_copy_(k)?;
        all_values.f_narrow(1, pos, n)?.f_copy_(v)?;
        let keys = keys as i64;
        Ok((all_keys.f_narrow(1, 0, keys)?.f_transpose(1, 2)?, all_values.f_narrow(1, 0, keys)?.f_transpose(1, 2)?))
    }

    /// Moves the rows at `base + slots[j]` to `base + j` in every layer (the accepted path of
    /// a token tree scored at `base`), reading them all before writing any.
    pub(crate) fn keep_rows(&mut self, base: usize, slots: &[usize]) -> Result<()> {
        if slots.iter().enumerate().all(|(j, &slot)| slot == j) {
            return Ok(());
        }
        let device = self.keys.first().map_or(Device::Cpu, Tensor::device);
        let index: Vec<i64> = slots.iter().map(|&slot| (base + slot) as i64).collect();
        let index = Tensor::from_slice(&index).f_to_device(device)?;
        for all in self.keys.iter().chain(&self.values) {
            let rows = all.f_index_select(1, &index)?;
            all.f_narrow(1, base as i64, slots.len() as i64)?.f_copy_(&rows)?;
        }
        Ok(())
    }
}

fn allocate(shape: &[i64], kind: Kind, device: Device, zeroed: bool) -> Result<Tensor> {
    Ok(if zeroed { Tensor::f_zeros(shape, (kind, device))? } else { Tensor::f_empty(shape, (kind, device))? })
}
