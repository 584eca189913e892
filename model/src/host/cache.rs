//! A session's keys and values on the host, per layer and KV head, laid out for attention
//! to read them as whole contiguous runs (which the CPU's prefetchers follow) rather than
//! as many strided ones:
//! - keys in panels of [`BLOCK`] positions, each `head_dim × BLOCK` (dimension-major), so
//!   that a query's scores against a panel are the same panel product as a linear layer's;
//!   the positions past the last whole panel sit in one `head_dim × rest` tail;
//! - values position-major (`capacity × head_dim`), so that the weighted sum of them is a
//!   run of multiply-adds over contiguous rows.

use specd_host_kernels::BLOCK;

use crate::error::{ModelError, Result};

/// The valid length is kept by the session table, as for the libtorch cache: truncation only
/// moves it back, and later writes overwrite the stale tail.
#[derive(Debug)]
pub(crate) struct HostCache {
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    /// Per layer, `kv_heads` regions of `capacity × head_dim`, each laid out by [`KeyLayout`].
    keys: Vec<Vec<f32>>,
    /// Per layer, `kv_heads × capacity × head_dim`.
    values: Vec<Vec<f32>>,
}

/// Where a key sits in its head's region of a cache of some capacity.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyLayout {
    head_dim: usize,
    capacity: usize,
}

impl KeyLayout {
    /// Positions held in whole panels.
    pub(crate) fn paneled(self) -> usize {
        self.capacity / BLOCK * BLOCK
    }

    /// Positions in the tail after the last whole panel.
    pub(crate) fn tail(self) -> usize {
        self.capacity - self.paneled()
    }

    /// The index of `position`'s key in dimension `dim`.
    pub(crate) fn at(self, position: usize, dim: usize) -> usize {
        let paneled = self.paneled();
        if position < paneled {
            (position / BLOCK) * BLOCK * self.head_dim + dim * BLOCK + position % BLOCK
        } else {
            paneled * self.head_dim + dim * self.tail() + position - paneled
        }
    }
}

impl HostCache {
    pub(crate) fn new(layers: usize, kv_heads: usize, head_dim: usize, capacity: usize) -> Result<Self> {
        let floats = kv_heads * head_dim * capacity;
        let zeros = |what: &str| -> Result<Vec<f32>> {
            let mut v = Vec::new();
            v.try_reserve_exact(floats).map_err(|e| {
                ModelError::OutOfMemory(format!("{what} of a host KV cache of {capacity} positions: {e}"))
            })?;
            v.resize(floats, 0.0);
            Ok(v)
        };
        let keys = (0..layers).map(|_| zeros("keys")).collect::<Result<_>>()?;
        let values = (0..layers).map(|_| zeros("values")).collect::<Result<_>>()?;
        Ok(Self { kv_heads, head_dim, capacity, keys, values })
    }

    /// Room for `capacity` positions in every layer, keeping what is there (both are laid
    /// out again: a head's region is `capacity` long). An allocation that fails is
    /// [`ModelError::OutOfMemory`], not an abort, and leaves the cache as it was.
    pub(crate) fn grow(&mut self, capacity: usize) -> Result<()> {
        let wider = self.copy_prefix(self.capacity, capacity)?;
        *self = wider;
        Ok(())
    }

    /// A new cache of `capacity` positions holding a copy of this one's first `len` (a
    /// prefix another session computed, which both then use apart).
    pub(crate) fn copy_prefix(&self, len: usize, capacity: usize) -> Result<Self> {
        let mut copy = Self::new(self.keys.len(), self.kv_heads, self.head_dim, capacity)?;
        let (old, new) = (self.key_layout(), copy.key_layout());
        let (hd, len) = (self.head_dim, len.min(self.capacity).min(capacity));
        for (new_keys, old_keys) in copy.keys.iter_mut().zip(&self.keys) {
            for (new_head, old_head) in
                new_keys.chunks_exact_mut(capacity * hd).zip(old_keys.chunks_exact(self.capacity * hd))
            {
                for d in 0..hd {
                    for p in 0..len {
                        new_head[new.at(p, d)] = old_head[old.at(p, d)];
                    }
                }
            }
        }
        for (new_values, old_values) in copy.values.iter_mut().zip(&self.values) {
            for (new_head, old_head) in
                new_values.chunks_exact_mut(capacity * hd).zip(old_values.chunks_exact(self.capacity * hd))
            {
                new_head[..len * hd].copy_from_slice(&old_head[..len * hd]);
            }
        }
        Ok(copy)
    }

    /// Writes the key and value of position `at` (`kv_heads × head_dim` each).
    pub(crate) fn write(&mut self, layer: usize, at: usize, k: &[f32], v: &[f32]) {
        let (hd, cap, layout) = (self.head_dim, self.capacity, self.key_layout());
        for (h, (key, value)) in k.chunks_exact(hd).zip(v.chunks_exact(hd)).enumerate() {
            let keys = &mut self.keys[layer][h * cap * hd..][..cap * hd];
            for (d, &x) in key.iter().enumerate() {
                keys[layout.at(at, d)] = x;
            }
            self.values[layer][(h * cap + at) * hd..][..hd].copy_from_slice(value);
        }
    }

    /// Moves the keys and values of slots `base + path[k]` to `base + k`, for a tree's kept
    /// path (ascending nodes, `path[k] ≥ k`: each slot is read before anything is written to it).
    pub(crate) fn keep_path(&mut self, base: usize, path: &[usize]) {
        let (hd, cap, layout) = (self.head_dim, self.capacity, self.key_layout());
        for (keys, values) in self.keys.iter_mut().zip(&mut self.values) {
            for (head_keys, head_values) in keys.chunks_exact_mut(cap * hd).zip(values.chunks_exact_mut(cap * hd)) {
                for (k, &node) in path.iter().enumerate().filter(|&(k, &node)| node != k) {
                    let (from, to) = (base + node, base + k);
                    for d in 0..hd {
                        head_keys[layout.at(to, d)] = head_keys[layout.at(from, d)];
                    }
                    head_values.copy_within(from * hd..(from + 1) * hd, to * hd);
                }
            }
        }
    }

    /// How layer keys are laid out in each head's region of [`Self::keys`].
    pub(crate) fn key_layout(&self) -> KeyLayout {
        KeyLayout { head_dim: self.head_dim, capacity: self.capacity }
    }

    /// Layer `layer`'s keys of KV head `head`, laid out as [`Self::key_layout`] says.
    pub(crate) fn keys(&self, layer: usize, head: usize) -> &[f32] {
        let len = self.capacity * self.head_dim;
        &self.keys[layer][head * len..][..len]
    }

    /// Layer `layer`'s values of KV head `head`, `capacity × head_dim`, position-major.
    pub(crate) fn values(&self, layer: usize, head: usize) -> &[f32] {
        let len = self.capacity * self.head_dim;
        &self.values[layer][head * len..][..len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Capacities on both sides of a panel's edge, so that positions move between the tail
    /// and whole panels as the cache grows.
    #[test]
    fn growing_and_copying_keep_every_written_key_and_value_where_it_is_read() {
        let (kv_heads, head_dim) = (2, 3);
        let entry = |p: usize| -> Vec<f32> { (0..kv_heads * head_dim).map(|i| (p * 10 + i) as f32).collect() };
        let check = |cache: &HostCache, written: &[usize]| {
            let layout = cache.key_layout();
            for &p in written {
                for head in 0..kv_heads {
                    for d in 0..head_dim {
                        let key = cache.keys(0, head)[layout.at(p, d)];
                        assert_eq!(key, entry(p)[head * head_dim + d], "key at {p}, head {head}, dim {d}");
                    }
                    let value = &cache.values(0, head)[p * head_dim..][..head_dim];
                    assert_eq!(value, &entry(p + 100)[head * head_dim..][..head_dim], "value at {p}, head {head}");
                }
            }
        };
        let mut cache = HostCache::new(1, kv_heads, head_dim, 2).unwrap();
        let mut written = vec![];
        for (capacity, new) in
            [(2, vec![0, 1]), (BLOCK + 8, vec![BLOCK - 1, BLOCK + 7]), (2 * BLOCK + 5, vec![2 * BLOCK + 4])]
        {
            cache.grow(capacity).unwrap();
            for &p in &new {
                cache.write(0, p, &entry(p), &entry(p + 100));
            }
            written.extend(new);
            check(&cache, &written);
        }
        let copy = cache.copy_prefix(BLOCK + 8, BLOCK + 9).unwrap();
        check(&copy, &written[..written.len() - 1]);
        // Every index a capacity's layout gives is inside its region, and no two collide.
        for capacity in [1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 7] {
            let layout = HostCache::new(1, 1, head_dim, capacity).unwrap().key_layout();
            let mut seen: Vec<usize> =
                (0..capacity).flat_map(|p| (0..head_dim).map(move |d| layout.at(p, d))).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..capacity * head_dim).collect::<Vec<_>>(), "capacity {capacity}");
        }
    }
}
