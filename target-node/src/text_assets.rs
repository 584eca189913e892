//! The model directory's text files, sent to the coordinator, which does all text work
//! (tokenising, chat templates, detokenising) so that the model's thread does none.

use std::path::Path;

use specd_model::TableModel;
use specd_proto::v1::TextAssetsResponse;
use specd_text::TextAssets;
use tonic::Status;

/// tokenizer.json is required; the others are sent when the directory has them
/// (`specd_text::TextAssets`). A table model (a file) sends the word-level tokenizer of its
/// token names.
pub(crate) fn read(dir: &Path) -> Result<TextAssetsResponse, Status> {
    if dir.is_file() {
        let table = TableModel::load(dir, None).map_err(|e| Status::internal(e.to_string()))?;
        let tokenizer_json = table
            .tokenizer_json()
            .ok_or_else(|| Status::failed_precondition(format!("the table model {} names no tokens", dir.display())))?;
        return Ok(TextAssetsResponse { tokenizer_json, ..Default::default() });
    }
    if !dir.join("tokenizer.json").is_file() {
        return Err(Status::failed_precondition(format!("the target model {} has no tokenizer.json", dir.display())));
    }
    let assets = TextAssets::from_dir(dir).map_err(|e| Status::internal(e.to_string()))?;
    Ok(TextAssetsResponse {
        tokenizer_json: assets.tokenizer_json,
        tokenizer_config_json: assets.tokenizer_config_json,
        chat_template_jinja: assets.chat_template_jinja,
        generation_config_json: assets.generation_config_json,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_what_the_directory_holds_and_requires_a_tokenizer() {
        let dir = std::env::temp_dir().join(format!("specd-text-assets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = read(&dir).unwrap_err();
        assert_eq!(missing.code(), tonic::Code::FailedPrecondition);
        std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
        std::fs::write(dir.join("chat_template.jinja"), "{{ messages }}").unwrap();
        let assets = read(&dir).unwrap();
        assert_eq!(assets.tokenizer_json, "{}");
        assert_eq!(assets.chat_template_jinja.as_deref(), Some("{{ messages }}"));
        assert_eq!(assets.tokenizer_config_json, None);
        // A table model is a file: it sends the tokenizer of its token names, if it has them.
        let named = dir.join("named.json");
        std::fs::write(&named, r#"{"vocab_size": 2, "tokens": ["yes", "no"], "default": [0.5, 0.5]}"#).unwrap();
        assert!(read(&named).unwrap().tokenizer_json.contains("WordLevel"));
        let unnamed = dir.join("unnamed.json");
        std::fs::write(&unnamed, r#"{"vocab_size": 2, "default": [0.5, 0.5]}"#).unwrap();
        assert_eq!(read(&unnamed).unwrap_err().code(), tonic::Code::FailedPrecondition);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
