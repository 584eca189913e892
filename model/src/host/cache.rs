//! A session's keys and values on the host, per layer. Keys are kept transposed
//! (`kv_heads × head_dim × capacity`), so that a query's scores against every position
//! are [`BLOCK`]-wide multiply-adds over contiguous positions; values position-major
//! (`capacity × kv_heads × head_dim`), so that the weighted sum of them is the same over
//! contiguous dimensions.

use crate::error::{ModelError, Result};

/// The valid length is kept by the session table, as for the libtorch cache: truncation only
/// moves it back, and later writes overwrite the stale tail.
#[derive(Debug)]
pub(crate) struct HostCache {
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl HostCache {
    pub(crate) fn new(layers: usize, kv_heads: usize, head_dim: usize, capacity: usize) -> Result<Self> {
        let mut cache =
            Self { kv_heads, head_dim, capacity: 0, keys: vec![Vec::new(); layers], values: vec![Vec::new(); layers] };
        cache.grow(capacity)?;
        Ok(cache)
    }

    /// Room for `capacity` positions in every layer, keeping what is there (the keys are
    /// laid out again: their rows are `capacity` long). An allocation that fails is
    /// [`ModelError::OutOfMemory`], not an abort.
    pub(crate) fn grow(&mut self, capacity: usize) -> Result<()> {
        let old = self.capacity;
        let floats = capacity * self.kv_heads * self.head_dim;
        let room =
            |what: &str, e| ModelError::OutOfMemory(format!("{what} of a host KV cache of {capacity} positions: {e}"));
        for keys in &mut self.keys {
            let mut wider = Vec::new();
            wider.try_reserve_exact(floats).map_err(|e| room("keys", e))?;
            wider.resize(floats, 0.0);
            for (new_row, old_row) in wider.chunks_exact_mut(capacity).zip(keys.chunks_exact(old.max(1))) {
                new_row[..old].copy_from_slice(&old_row[..old]);
            }
            *keys = wider;
        }
        for values in &mut self.values {
            values.try_reserve_exact(floats.saturating_sub(values.len())).map_err(|e| room("values", e))?;
            values.resize(floats, 0.0);
        }
        self.capacity = capacity;
        Ok(())
    }

    /// A new cache of `capacity` positions holding a copy of this one's first `len` (a
    /// prefix another session computed, which both then use apart).
    pub(crate) fn copy_prefix(&self, len: usize, capacity: usize) -> Result<Self> {
        let mut copy = Self::new(self.keys.len(), self.kv_heads, self.head_dim, capacity)?;
        for (new, old) in copy.keys.iter_mut().zip(&self.keys) {
            for (new_row, old_row) in new.chunks_exact_mut(capacity).zip(old.chunks_exact(self.capacity.max(1))) {
                new_row[..len].copy_from_slice(&old_row[..len]);
            }
        }
        let width = self.kv_heads * self.head_dim;
        for (new, old) in copy.values.iter_mut().zip(&self.values) {
            new[..len * width].copy_from_slice(&old[..len * width]);
        }
        Ok(copy)
    }

    /// Writes the key and value of position `at` (`kv_heads × head_dim` each).
    pub(crate) fn write(&mut self, layer: usize, at: usize, k: &[f32], v: &[f32]) {
        let cap = self.capacity;
        for (row, &x) in self.keys[layer].chunks_exact_mut(cap).zip(k) {
            row[at] = x;
        }
        let width = v.len();
        self.values[layer][at * width..(at + 1) * width].copy_from_slice(v);
    }

    /// Layer `layer`'s keys of KV head `head`: `head_dim` rows of [`Self::capacity`]
    /// positions each.
    pub(crate) fn keys(&self, layer: usize, head: usize) -> &[f32] {
        let rows = self.head_dim * self.capacity;
        &self.keys[layer][head * rows..(head + 1) * rows]
    }

    /// Layer `layer`'s values, position-major.
    pub(crate) fn values(&self, layer: usize) -> &[f32] {
        &self.values[layer]
    }

    /// Positions each key row holds.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growing_keeps_every_written_key_and_value_where_it_is_read() {
        let (kv_heads, head_dim) = (2, 3);
        let mut cache = HostCache::new(1, kv_heads, head_dim, 2).unwrap();
        let entry = |p: usize| -> Vec<f32> { (0..kv_heads * head_dim).map(|i| (p * 10 + i) as f32).collect() };
        for p in 0..2 {
            cache.write(0, p, &entry(p), &entry(p + 100));
        }
        cache.grow(5).unwrap();
        cache.write(0, 4, &entry(4), &entry(104));
        for p in [0, 1, 4] {
            for head in 0..kv_heads {
                for d in 0..head_dim {
                    let key = cache.keys(0, head)[d * cache.capacity() + p];
                    assert_eq!(key, entry(p)[head * head_dim + d], "key at {p}, head {head}, dim {d}");
                }
            }
            assert_eq!(cache.values(0)[p * 6..(p + 1) * 6], entry(p + 100)[..]);
        }
    }
}
