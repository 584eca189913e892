//! A session's keys and values on the host, per layer and KV head, laid out for attention
//! to read them as whole contiguous runs (which the CPU's prefetchers follow) rather than
//! as many strided ones:
//! - keys in panels of [`BLOCK`] positions, each `head_dim × BLOCK` (dimension-major), so
//!   that a query's scores against a panel are the same panel product as a linear layer's;
//!   the positions past the last whole panel sit in one `head_dim × rest` tail;
//! - values position-major (`capacity × head_dim`), so that the weighted sum of them is a
//!   run of multiply-adds over contiguous rows.

use specd_host_kernels::{BLOCK, to_bf16};

use crate::error::{ModelError, Result};

/// How a cache stores its keys and values: f32, or bf16 (half the bytes a pass reads and a
/// session holds), which the kernels widen to f32 as they read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KvFormat {
    F32,
    Bf16,
}

/// One KV head's keys or values of one layer, as stored.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KvRows<'a> {
    F32(&'a [f32]),
    /// `to_bf16`'s bits.
    Bf16(&'a [u16]),
}

impl<'a> KvRows<'a> {
    /// The elements from `start` on.
    pub(crate) fn from(self, start: usize) -> Self {
        match self {
            Self::F32(v) => Self::F32(&v[start..]),
            Self::Bf16(v) => Self::Bf16(&v[start..]),
        }
    }
}

/// A layer's keys and values of every KV head, in one element type: per KV head, a region of
/// `capacity × head_dim` each (keys laid out by [`KeyLayout`], values position-major).
#[derive(Debug)]
struct KeysValues<T> {
    keys: Vec<T>,
    values: Vec<T>,
}

/// A layer as stored: both halves in f32, or both in bf16.
#[derive(Debug)]
enum StoredLayer {
    F32(KeysValues<f32>),
    Bf16(KeysValues<u16>),
}

/// A value as a stored element: itself, or rounded to bf16.
trait Element: Copy + Default {
    fn store(x: f32) -> Self;
}

impl Element for f32 {
    fn store(x: f32) -> Self {
        x
    }
}

impl Element for u16 {
    fn store(x: f32) -> Self {
        to_bf16(x)
    }
}

/// `floats` zeros, or [`ModelError::OutOfMemory`] naming `what`.
fn zeros<T: Element>(floats: usize, what: &str, capacity: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(floats)
        .map_err(|e| ModelError::OutOfMemory(format!("{what} of a host KV cache of {capacity} positions: {e}")))?;
    v.resize(floats, T::default());
    Ok(v)
}

/// The valid length is kept by the session table, as for the libtorch cache: truncation only
/// moves it back, and later writes overwrite the stale tail.
#[derive(Debug)]
pub(crate) struct HostCache {
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    layers: Vec<StoredLayer>,
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

    /// How far apart `position`'s keys of consecutive dimensions are.
    pub(crate) fn stride(self, position: usize) -> usize {
        if position < self.paneled() { BLOCK } else { self.tail() }
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

/// A layer laid out by `new` holding the first `len` positions' keys and values of each
/// head of `old`, laid out by `from`.
fn copy_heads<T: Element>(old: &KeysValues<T>, from: KeyLayout, new: KeyLayout, len: usize) -> Result<KeysValues<T>> {
    let hd = new.head_dim;
    let (new_region, old_region) = (new.capacity * hd, from.capacity * hd);
    let floats = old.keys.len() / old_region * new_region;
    let mut copy =
        KeysValues { keys: zeros(floats, "keys", new.capacity)?, values: zeros(floats, "values", new.capacity)? };
    for (new_head, old_head) in copy.keys.chunks_exact_mut(new_region).zip(old.keys.chunks_exact(old_region)) {
        for d in 0..hd {
            for p in 0..len {
                new_head[new.at(p, d)] = old_head[from.at(p, d)];
            }
        }
    }
    for (new_head, old_head) in copy.values.chunks_exact_mut(new_region).zip(old.values.chunks_exact(old_region)) {
        new_head[..len * hd].copy_from_slice(&old_head[..len * hd]);
    }
    Ok(copy)
}

/// Writes one position's keys and values (`kv_heads × head_dim` each) into a layer.
fn write_position<T: Element>(layer: &mut KeysValues<T>, layout: KeyLayout, at: usize, k: &[f32], v: &[f32]) {
    let (hd, cap) = (layout.head_dim, layout.capacity);
    let KeysValues { keys, values } = layer;
    for (h, (key, value)) in k.chunks_exact(hd).zip(v.chunks_exact(hd)).enumerate() {
        let head_keys = &mut keys[h * cap * hd..][..cap * hd];
        // A position's dimensions lie one stride apart (a panel's width, or the tail's).
        let (first, stride) = (layout.at(at, 0), layout.stride(at));
        for (stored, &x) in head_keys[first..].iter_mut().step_by(stride).zip(key) {
            *stored = T::store(x);
        }
        for (stored, &x) in values[(h * cap + at) * hd..][..hd].iter_mut().zip(value) {
            *stored = T::store(x);
        }
    }
}

/// Moves the keys and values of slots `base + path[k]` to `base + k` in a layer.
fn keep_path_in<T: Copy>(layer: &mut KeysValues<T>, layout: KeyLayout, base: usize, path: &[usize]) {
    let (hd, cap) = (layout.head_dim, layout.capacity);
    let KeysValues { keys, values } = layer;
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

impl HostCache {
    pub(crate) fn new(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        format: KvFormat,
    ) -> Result<Self> {
        let floats = kv_heads * head_dim * capacity;
        let layer = || -> Result<StoredLayer> {
            Ok(match format {
                KvFormat::F32 => StoredLayer::F32(KeysValues {
                    keys: zeros(floats, "keys", capacity)?,
                    values: zeros(floats, "values", capacity)?,
                }),
                KvFormat::Bf16 => StoredLayer::Bf16(KeysValues {
                    keys: zeros(floats, "keys", capacity)?,
                    values: zeros(floats, "values", capacity)?,
                }),
            })
        };
        let layers = (0..layers).map(|_| layer()).collect::<Result<_>>()?;
        Ok(Self { kv_heads, head_dim, capacity, layers })
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
        let (from, new) = (self.key_layout(), KeyLayout { head_dim: self.head_dim, capacity });
        let len = len.min(self.capacity).min(capacity);
        let layers = self
            .layers
            .iter()
            .map(|layer| {
                Ok(match layer {
                    StoredLayer::F32(old) => StoredLayer::F32(copy_heads(old, from, new, len)?),
                    StoredLayer::Bf16(old) => StoredLayer::Bf16(copy_heads(old, from, new, len)?),
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self { kv_heads: self.kv_heads, head_dim: self.head_dim, capacity, layers })
    }

    /// Writes the key and value of position `at` (`kv_heads × head_dim` each), rounded to
    /// bf16 in a bf16 cache.
    pub(crate) fn write(&mut self, layer: usize, at: usize, k: &[f32], v: &[f32]) {
        let layout = self.key_layout();
        match &mut self.layers[layer] {
            StoredLayer::F32(layer) => write_position(layer, layout, at, k, v),
            StoredLayer::Bf16(layer) => write_position(layer, layout, at, k, v),
        }
    }

    /// Moves the keys and values of slots `base + path[k]` to `base + k`, for a tree's kept
    /// path (ascending nodes, `path[k] ≥ k`: each slot is read before anything is written to it).
    pub(crate) fn keep_path(&mut self, base: usize, path: &[usize]) {
        let layout = self.key_layout();
        for layer in &mut self.layers {
            match layer {
                StoredLayer::F32(layer) => keep_path_in(layer, layout, base, path),
                StoredLayer::Bf16(layer) => keep_path_in(layer, layout, base, path),
            }
        }
    }

    /// How layer keys are laid out in each head's region of [`Self::keys`].
    pub(crate) fn key_layout(&self) -> KeyLayout {
        KeyLayout { head_dim: self.head_dim, capacity: self.capacity }
    }

    /// Layer `layer`'s keys of KV head `head`, laid out as [`Self::key_layout`] says.
    pub(crate) fn keys(&self, layer: usize, head: usize) -> KvRows<'_> {
        let region = self.capacity * self.head_dim;
        match &self.layers[layer] {
            StoredLayer::F32(layer) => KvRows::F32(&layer.keys[head * region..][..region]),
            StoredLayer::Bf16(layer) => KvRows::Bf16(&layer.keys[head * region..][..region]),
        }
    }

    /// Layer `layer`'s values of KV head `head`, `capacity × head_dim`, position-major.
    pub(crate) fn values(&self, layer: usize, head: usize) -> KvRows<'_> {
        let region = self.capacity * self.head_dim;
        match &self.layers[layer] {
            StoredLayer::F32(layer) => KvRows::F32(&layer.values[head * region..][..region]),
            StoredLayer::Bf16(layer) => KvRows::Bf16(&layer.values[head * region..][..region]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Element `i` of `rows`, widened as the kernels widen it.
    fn read(rows: KvRows<'_>, i: usize) -> f32 {
        match rows {
            KvRows::F32(v) => v[i],
            KvRows::Bf16(v) => specd_host_kernels::from_bf16(v[i]),
        }
    }

    /// Capacities on both sides of a panel's edge, so that positions move between the tail
    /// and whole panels as the cache grows.
    #[test]
    fn growing_and_copying_keep_every_written_key_and_value_where_it_is_read() {
        for format in [KvFormat::F32, KvFormat::Bf16] {
            keeps_every_written_key_and_value(format);
        }
    }

    fn keeps_every_written_key_and_value(format: KvFormat) {
        let (kv_heads, head_dim) = (2, 3);
        // Not bf16 values (a third's fractions): a bf16 cache holds each rounded to bf16, an
        // f32 cache exactly.
        let entry = |p: usize| -> Vec<f32> { (0..kv_heads * head_dim).map(|i| (p * 10 + i) as f32 / 3.0).collect() };
        let stored = |x: f32| if format == KvFormat::Bf16 { specd_host_kernels::bf16_value(x) } else { x };
        assert_ne!(stored(entry(1)[1]) == entry(1)[1], format == KvFormat::Bf16);
        let check = |cache: &HostCache, written: &[usize]| {
            let layout = cache.key_layout();
            for &p in written {
                for head in 0..kv_heads {
                    for d in 0..head_dim {
                        let key = read(cache.keys(0, head), layout.at(p, d));
                        assert_eq!(key, stored(entry(p)[head * head_dim + d]), "key at {p}, head {head}, dim {d}");
                        let value = read(cache.values(0, head), p * head_dim + d);
                        let want = stored(entry(p + 100)[head * head_dim + d]);
                        assert_eq!(value, want, "value at {p}, head {head}, dim {d}");
                    }
                }
            }
        };
        let mut cache = HostCache::new(1, kv_heads, head_dim, 2, format).unwrap();
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
            let layout = HostCache::new(1, 1, head_dim, capacity, format).unwrap().key_layout();
            let mut seen: Vec<usize> =
                (0..capacity).flat_map(|p| (0..head_dim).map(move |d| layout.at(p, d))).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..capacity * head_dim).collect::<Vec<_>>(), "capacity {capacity}");
        }
    }

    #[test]
    fn keeping_a_tree_path_moves_its_keys_and_values_down_in_either_format() {
        let (kv_heads, head_dim) = (2, 3);
        let entry = |p: usize| -> Vec<f32> { (0..kv_heads * head_dim).map(|i| (p * 10 + i) as f32 / 3.0).collect() };
        for format in [KvFormat::F32, KvFormat::Bf16] {
            let stored = |x: f32| if format == KvFormat::Bf16 { specd_host_kernels::bf16_value(x) } else { x };
            // Slots past a panel's edge, so that moves cross from the tail into a panel.
            let (capacity, base) = (BLOCK + 9, BLOCK - 2);
            let mut cache = HostCache::new(1, kv_heads, head_dim, capacity, format).unwrap();
            for p in 0..capacity {
                cache.write(0, p, &entry(p), &entry(p + 100));
            }
            let path = [0, 2, 5];
            cache.keep_path(base, &path);
            let layout = cache.key_layout();
            for (k, &node) in path.iter().enumerate() {
                let (slot, from) = (base + k, base + node);
                for head in 0..kv_heads {
                    for d in 0..head_dim {
                        let key = read(cache.keys(0, head), layout.at(slot, d));
                        assert_eq!(key, stored(entry(from)[head * head_dim + d]), "{format:?}: key at {slot}");
                        let value = read(cache.values(0, head), slot * head_dim + d);
                        assert_eq!(
                            value,
                            stored(entry(from + 100)[head * head_dim + d]),
                            "{format:?}: value at {slot}"
                        );
                    }
                }
            }
        }
    }
}
