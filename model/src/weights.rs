//! Weights from `model.safetensors` or a sharded `model.safetensors.index.json`.
//!
//! Only the headers are read up front; each tensor is read from its file when the model
//! takes it, 64 KiB at a time straight into the tensor the model keeps (in the run's dtype,
//! on its device; fused projections read each part into its rows). A load therefore holds the model and one chunk, where reading whole files
//! held every file's bytes beside the model built from them (twice its size). (A memory map
//! would serve the same from page-cache pages, but needs `unsafe`, which this workspace
//! forbids; positional reads leave the same pages in the page cache, outside the process.)
//!
//! What the model does not take is an error naming those tensors ([`WeightStore::finish`]):
//! a bias the config does not declare, a layer past `num_hidden_layers`, a tensor of another
//! architecture all mean the checkpoint would compute something else than the model built.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use safetensors::Dtype;
use safetensors::tensor::Metadata;
use tch::{Device, Kind, Tensor};

use crate::config::read_json;
use crate::error::{ModelError, Result};

/// Tensors a checkpoint may hold that no model here needs and transformers skips too:
/// old checkpoints stored RoPE's inverse frequencies per layer.
const IGNORED_SUFFIXES: [&str; 1] = ["rotary_emb.inv_freq"];

/// A tensor of a checkpoint, not read yet.
#[derive(Debug)]
struct Entry {
    /// Index into [`WeightStore::files`].
    file: usize,
    dtype: Dtype,
    shape: Vec<i64>,
    /// Byte offset of its data in the file, and its length.
    offset: u64,
    len: usize,
}

/// The tensors of a checkpoint, read one at a time as the model takes them.
#[derive(Debug)]
pub(crate) struct WeightStore {
    entries: HashMap<String, Entry>,
    files: Vec<(PathBuf, File)>,
    /// Where a missing tensor "should" have been: the single file or the index.
    source: PathBuf,
    device: Device,
    kind: Kind,
    /// Where tensors are read into before libtorch copies them.
    buffer: Vec<u8>,
}

impl WeightStore {
    /// Reads the headers of the checkpoint in `dir`; tensors come as the model takes them,
    /// converted to `kind` on `device`.
    pub(crate) fn open(dir: &Path, device: Device, kind: Kind) -> Result<Self> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let (source, paths) = if single.is_file() {
            (single.clone(), vec![single])
        } else if index.is_file() {
            (index.clone(), shard_files(dir, &index)?)
        } else {
            return Err(ModelError::MissingFile {
                path: single,
                what: "no model.safetensors and no model.safetensors.index.json".into(),
            });
        };
        let mut store = Self { entries: HashMap::new(), files: Vec::new(), source, device, kind, buffer: Vec::new() };
        for path in paths {
            store.index_file(path)?;
        }
        Ok(store)
    }

    /// Takes the tensor `name`, checking that its shape is `shape`.
    pub(crate) fn take(&mut self, name: &str, shape: &[i64]) -> Result<Tensor> {
        self.take_stacked(&[(name, shape)])
    }

    /// Takes the tensors `parts` (each checked against its shape) stacked along dim 0 into
    /// one tensor, each read straight into its rows: a fused projection without a second
    /// copy of its parts.
    pub(crate) fn take_stacked(&mut self, parts: &[(&str, &[i64])]) -> Result<Tensor> {
        let mut entries = Vec::with_capacity(parts.len());
        for &(name, shape) in parts {
            let entry = self.entry(name, shape)?;
            entries.push((name, entry));
        }
        let rows: i64 = parts.iter().map(|(_, shape)| shape.first().copied().unwrap_or(1)).sum();
        let shape: Vec<i64> = match parts {
            [(_, one)] => one.to_vec(),
            _ => std::iter::once(rows).chain(parts[0].1.iter().skip(1).copied()).collect(),
        };
        let out = Tensor::f_empty(shape.as_slice(), (self.kind, self.device))?;
        let flat = out.f_view([-1])?;
        let mut at = 0i64;
        for (name, (entry, stored)) in entries {
            let numel: i64 = entry.shape.iter().product();
            let (path, file) = &self.files[entry.file];
            let rows = flat.f_narrow(0, at, numel)?;
            fill(&rows, file, &entry, stored, &mut self.buffer).map_err(|e| match e {
                ReadError::Io(source) => ModelError::Io { path: path.clone(), source },
                ReadError::Torch(e) => ModelError::Torch(e),
            })?;
            at += numel;
            let _ = name;
        }
        Ok(out)
    }

    /// Removes `name`'s entry, checking its dtype and shape, with the kind it is stored in.
    fn entry(&mut self, name: &str, shape: &[i64]) -> Result<(Entry, Kind)> {
        let entry = self
            .entries
            .remove(name)
            .ok_or_else(|| ModelError::MissingTensor { path: self.source.clone(), tensor: name.to_owned() })?;
        let path = &self.files[entry.file].0;
        let stored = match entry.dtype {
            Dtype::F32 => Kind::Float,
            Dtype::F16 => Kind::Half,
            Dtype::BF16 => Kind::BFloat16,
            Dtype::F64 => Kind::Double,
            other => {
                return Err(ModelError::TensorDtype {
                    path: path.clone(),
                    tensor: name.to_owned(),
                    dtype: format!("{other:?}"),
                });
            }
        };
        if entry.shape != shape {
            return Err(ModelError::TensorShape {
                path: path.clone(),
                tensor: name.to_owned(),
                expected: shape.to_vec(),
                found: entry.shape,
            });
        }
        Ok((entry, stored))
    }

    /// Names the tensors of a multimodal checkpoint's text model as the text model's own
    /// (`from` prefixes become `to`), and forgets those under `skip` (the vision tower).
    pub(crate) fn rename_and_skip(&mut self, renames: &[(&str, &str)], skip: &[&str]) {
        let entries = std::mem::take(&mut self.entries);
        for (name, entry) in entries {
            if skip.iter().any(|prefix| name.starts_with(prefix)) {
                continue;
            }
            let renamed = renames
                .iter()
                .find_map(|(from, to)| name.strip_prefix(from).map(|rest| format!("{to}{rest}")))
                .unwrap_or(name);
            self.entries.insert(renamed, entry);
        }
    }

    /// Takes `name` if present (checking its shape), `None` if absent.
    pub(crate) fn take_optional(&mut self, name: &str, shape: &[i64]) -> Result<Option<Tensor>> {
        if self.entries.contains_key(name) { self.take(name, shape).map(Some) } else { Ok(None) }
    }

    /// Ends the load: the tensors nobody took are an error naming them, unless `allow` (then
    /// they are skipped, as transformers skips them with a warning).
    pub(crate) fn finish(self, allow: bool) -> Result<()> {
        let unused: BTreeSet<String> = self
            .entries
            .into_keys()
            .filter(|name| !IGNORED_SUFFIXES.iter().any(|suffix| name.ends_with(suffix)))
            .collect();
        if unused.is_empty() || allow {
            return Ok(());
        }
        Err(ModelError::UnusedTensors { path: self.source, tensors: unused.into_iter().collect() })
    }

    /// Reads the header of one safetensors file and remembers where each tensor lies.
    fn index_file(&mut self, path: PathBuf) -> Result<()> {
        let invalid = |message: String| ModelError::InvalidFile { path: path.clone(), message };
        let file = File::open(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
        let file_len = file.metadata().map_err(|source| ModelError::Io { path: path.clone(), source })?.len();
        let mut prefix = [0u8; 8];
        file.read_exact_at(&mut prefix, 0).map_err(|_| invalid("shorter than a safetensors header".into()))?;
        let header_len = u64::from_le_bytes(prefix);
        // safetensors' own bound on a header (100 MB).
        if header_len > 100_000_000 || 8 + header_len > file_len {
            return Err(invalid(format!("header length {header_len} does not fit the file of {file_len} bytes")));
        }
        let mut header = vec![0u8; header_len as usize];
        file.read_exact_at(&mut header, 8).map_err(|source| ModelError::Io { path: path.clone(), source })?;
        let metadata: Metadata =
            serde_json::from_slice(&header).map_err(|e| invalid(format!("bad safetensors header: {e}")))?;
        let data_start = 8 + header_len;
        let data_len = file_len - data_start;
        let index = self.files.len();
        for (name, info) in metadata.tensors() {
            let (start, end) = info.data_offsets;
            let elements = info.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            let expected = elements.and_then(|n| n.checked_mul(info.dtype.bitsize())).map(|bits| bits.div_ceil(8));
            if end < start || end as u64 > data_len || expected != Some(end - start) {
                return Err(invalid(format!("tensor {name} has offsets {start}..{end} that do not fit its shape")));
            }
            let shape = info.shape.iter().map(|&d| d as i64).collect();
            self.entries.insert(
                name,
                Entry { file: index, dtype: info.dtype, shape, offset: data_start + start as u64, len: end - start },
            );
        }
        self.files.push((path, file));
        Ok(())
    }
}

/// Bytes read at a time. Small on purpose: glibc serves blocks under 128 KiB from its heap,
/// where the next chunk reuses them, while freeing a larger (memory-mapped) block raises
/// its threshold for mapping, after which freed blocks of weights' sizes stay in the heap
/// and the process holds up to half the model again (measured: 1.2–1.45× the checkpoint
/// with 16 MiB chunks, 1.1× with these).
const CHUNK_BYTES: usize = 64 << 10;

#[derive(Debug)]
enum ReadError {
    Io(std::io::Error),
    Torch(tch::TchError),
}

impl From<tch::TchError> for ReadError {
    fn from(e: tch::TchError) -> Self {
        Self::Torch(e)
    }
}

/// Reads `entry` of `file` into `out` (its elements, flat, in any dtype and on any device:
/// `copy_` converts), [`CHUNK_BYTES`] at a time through `buffer`, which is kept from tensor
/// to tensor.
fn fill(
    out: &Tensor,
    file: &File,
    entry: &Entry,
    stored: Kind,
    buffer: &mut Vec<u8>,
) -> std::result::Result<(), ReadError> {
    let element = stored.elt_size_in_bytes();
    let chunk_len = entry.len.min(CHUNK_BYTES);
    if buffer.len() < chunk_len {
        *buffer = vec![0u8; CHUNK_BYTES.min(chunk_len.next_power_of_two())];
    }
    let mut done = 0usize;
    while done < entry.len {
        let n = (entry.len - done).min(buffer.len());
        file.read_exact_at(&mut buffer[..n], entry.offset + done as u64).map_err(ReadError::Io)?;
        let chunk = Tensor::f_from_data_size(&buffer[..n], &[(n / element) as i64], stored)?;
        out.f_narrow(0, (done / element) as i64, (n / element) as i64)?.f_copy_(&chunk)?;
        done += n;
    }
    Ok(())
}

fn shard_files(dir: &Path, index: &Path) -> Result<Vec<PathBuf>> {
    let value = read_json(index, "")?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| ModelError::InvalidFile { path: index.to_owned(), message: "no weight_map object".into() })?;
    let mut names = BTreeSet::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| ModelError::InvalidFile {
            path: index.to_owned(),
            message: format!("weight_map[{tensor:?}] is not a file name"),
        })?;
        if file.contains('/') || file.contains("..") {
            return Err(ModelError::InvalidFile {
                path: index.to_owned(),
                message: format!("weight_map[{tensor:?}] = {file:?} leaves the checkpoint"),
            });
        }
        names.insert(file.to_owned());
    }
    let files: Vec<PathBuf> = names.into_iter().map(|f| dir.join(f)).collect();
    for f in &files {
        if !f.is_file() {
            return Err(ModelError::MissingFile {
                path: f.clone(),
                what: format!("shard listed in {}", index.display()),
            });
        }
    }
    Ok(files)
}
