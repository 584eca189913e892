//! Weights from `model.safetensors` or a sharded `model.safetensors.index.json`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use tch::{Device, Kind, Tensor};

use crate::config::read_json;
use crate::error::{ModelError, Result};

/// Tensors read from a checkpoint, converted to the run's dtype and device, each remembered
/// with the file it came from so that shape errors name it.
#[derive(Debug)]
pub(crate) struct WeightStore {
    tensors: HashMap<String, (Tensor, PathBuf)>,
    /// Tensors stored with a dtype we do not convert (file, dtype); an error only if needed.
    unsupported: HashMap<String, (PathBuf, String)>,
    /// Where a missing tensor "should" have been: the single file or the index.
    source: PathBuf,
}

impl WeightStore {
    /// Reads every tensor of the checkpoint in `dir`.
    pub(crate) fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let (source, files) = if single.is_file() {
            (single.clone(), vec![single])
        } else if index.is_file() {
            (index.clone(), shard_files(dir, &index)?)
        } else {
            return Err(ModelError::MissingFile {
                path: single,
                what: "no model.safetensors and no model.safetensors.index.json".into(),
            });
        };
        let mut store = Self { tensors: HashMap::new(), unsupported: HashMap::new(), source };
        for file in files {
            store.read_file(&file, device, kind)?;
        }
        Ok(store)
    }

    /// Takes the tensor `name`, checking that its shape is `shape`.
    pub(crate) fn take(&mut self, name: &str, shape: &[i64]) -> Result<Tensor> {
        if let Some((path, dtype)) = self.unsupported.remove(name) {
            return Err(ModelError::TensorDtype { path, tensor: name.to_owned(), dtype });
        }
        let (t, path) = self
            .tensors
            .remove(name)
            .ok_or_else(|| ModelError::MissingTensor { path: self.source.clone(), tensor: name.to_owned() })?;
        let found = t.size();
        if found != shape {
            return Err(ModelError::TensorShape { path, tensor: name.to_owned(), expected: shape.to_vec(), found });
        }
        Ok(t)
    }

    /// Takes `name` if present (checking its shape), `None` if absent.
    pub(crate) fn take_optional(&mut self, name: &str, shape: &[i64]) -> Result<Option<Tensor>> {
        if self.tensors.contains_key(name) || self.unsupported.contains_key(name) {
            self.take(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    fn read_file(&mut self, path: &Path, device: Device, kind: Kind) -> Result<()> {
        let bytes = std::fs::read(path).map_err(|source| ModelError::Io { path: path.to_owned(), source })?;
        let st = SafeTensors::deserialize(&bytes)
            .map_err(|e| ModelError::InvalidFile { path: path.to_owned(), message: e.to_string() })?;
        for (name, view) in st.tensors() {
            let stored = match view.dtype() {
                Dtype::F32 => Kind::Float,
                Dtype::F16 => Kind::Half,
                Dtype::BF16 => Kind::BFloat16,
                Dtype::F64 => Kind::Double,
                other => {
                    self.unsupported.insert(name, (path.to_owned(), format!("{other:?}")));
                    continue;
                }
            };
            let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
            let t = Tensor::f_from_data_size(view.data(), &shape, stored)?.f_to_device(device)?.f_to_kind(kind)?;
            self.tensors.insert(name, (t, path.to_owned()));
        }
        Ok(())
    }
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
