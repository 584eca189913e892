//! The text files of a model directory, read into memory so they can be shipped (e.g. from the
//! target node to the coordinator) and parsed anywhere.

use std::path::Path;

use crate::error::TextError;

/// The files [`crate::ModelText`] is built from, as text.
#[derive(Clone, Debug, Default)]
pub struct TextAssets {
    /// `tokenizer.json` (required).
    pub tokenizer_json: String,
    /// `tokenizer_config.json`: bos/eos strings and, in older models, the chat template.
    pub tokenizer_config_json: Option<String>,
    /// `chat_template.jinja`: the chat template in newer models; wins over the config's.
    pub chat_template_jinja: Option<String>,
    /// `generation_config.json`: the model's sampling defaults.
    pub generation_config_json: Option<String>,
}

impl TextAssets {
    /// Reads the files from a model directory; only `tokenizer.json` must exist.
    pub fn from_dir(dir: &Path) -> Result<Self, TextError> {
        let tokenizer_json = read(dir, "tokenizer.json")?.ok_or_else(|| TextError::Io {
            path: dir.join("tokenizer.json"),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "a model's text needs tokenizer.json"),
        })?;
        Ok(Self {
            tokenizer_json,
            tokenizer_config_json: read(dir, "tokenizer_config.json")?,
            chat_template_jinja: read(dir, "chat_template.jinja")?,
            generation_config_json: read(dir, "generation_config.json")?,
        })
    }
}

/// The file's text, `None` when it does not exist.
fn read(dir: &Path, name: &str) -> Result<Option<String>, TextError> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TextError::Io { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_exists_and_requires_only_the_tokenizer() {
        let dir = std::env::temp_dir().join(format!("specd-text-assets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = TextAssets::from_dir(&dir).unwrap_err();
        assert!(matches!(missing, TextError::Io { .. }), "{missing}");
        std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
        std::fs::write(dir.join("chat_template.jinja"), "{{ x }}").unwrap();
        let assets = TextAssets::from_dir(&dir).unwrap();
        assert_eq!(assets.tokenizer_json, "{}");
        assert_eq!(assets.chat_template_jinja.as_deref(), Some("{{ x }}"));
        assert!(assets.tokenizer_config_json.is_none() && assets.generation_config_json.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
