//! Everything about one model's text: its tokenizer, chat template, bos/eos strings and
//! generation defaults.

use std::str::FromStr;
use std::sync::Arc;

use tokenizers::Tokenizer;

use crate::assets::TextAssets;
use crate::chat_template::{ChatMessage, ChatTemplate, ChatTool};
use crate::error::TextError;
use crate::generation_config::GenerationDefaults;

/// A model's text side, cheap to share (the tokenizer is behind an `Arc`).
#[derive(Debug)]
pub struct ModelText {
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<ChatTemplate>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    defaults: GenerationDefaults,
}

impl ModelText {
    /// Parses the assets. Every error here is the model files' fault.
    pub fn from_assets(assets: &TextAssets) -> Result<ModelText, TextError> {
        let tokenizer = Tokenizer::from_str(&assets.tokenizer_json).map_err(|e| TextError::Tokenizer(e.to_string()))?;
        let config: Option<serde_json::Value> = match &assets.tokenizer_config_json {
            None => None,
            Some(text) => Some(
                serde_json::from_str(text)
                    .map_err(|e| TextError::Json { file: "tokenizer_config.json", message: e.to_string() })?,
            ),
        };
        let special = |key: &str| config.as_ref().and_then(|c| c.get(key)).and_then(token_content);
        let chat_template =
            ChatTemplate::from_files(assets.tokenizer_config_json.as_deref(), assets.chat_template_jinja.as_deref())?;
        let defaults = match &assets.generation_config_json {
            Some(json) => GenerationDefaults::from_json(json)?,
            None => GenerationDefaults::default(),
        };
        Ok(ModelText {
            tokenizer: Arc::new(tokenizer),
            chat_template,
            bos_token: special("bos_token"),
            eos_token: special("eos_token"),
            defaults,
        })
    }

    /// Text to ids. `add_special_tokens` adds what the tokenizer's post-processor adds (e.g.
    /// BOS), as transformers' `encode` does by default and as the target node's `Tokenize`
    /// does; a rendered chat is encoded without them (see [`ModelText::encode_chat_prompt`]).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TextError> {
        let encoding = self.tokenizer.encode(text, add_special_tokens).map_err(|e| TextError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Ids to text, skipping special tokens, as the target node's `Detokenize` does
    /// (`Tokenizer::decode(ids, true)`). For streamed output use
    /// [`crate::IncrementalDetokenizer`] or [`crate::TextStream`] instead.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        self.tokenizer.decode(ids, true).map_err(|e| TextError::Tokenizer(e.to_string()))
    }

    /// Encodes a prompt rendered by the chat template. transformers'
    /// `apply_chat_template(tokenize=True)` encodes with `add_special_tokens=False`: the
    /// template writes the bos token itself, and adding it again would double it.
    pub fn encode_chat_prompt(&self, rendered: &str) -> Result<Vec<u32>, TextError> {
        self.encode(rendered, false)
    }

    /// Renders a chat, offering `tools` (none when empty), with the model's template and its
    /// bos/eos strings.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        tools: &[ChatTool],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        let template = self.chat_template.as_ref().ok_or(TextError::NoChatTemplate)?;
        template.render(
            messages,
            tools,
            add_generation_prompt,
            self.bos_token.as_deref().unwrap_or(""),
            self.eos_token.as_deref().unwrap_or(""),
        )
    }

    /// The prompt ids of a chat: [`ModelText::render_chat`] then
    /// [`ModelText::encode_chat_prompt`].
    pub fn chat_prompt_ids(
        &self,
        messages: &[ChatMessage],
        tools: &[ChatTool],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, TextError> {
        self.encode_chat_prompt(&self.render_chat(messages, tools, add_generation_prompt)?)
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// `tokenizer_config.json`'s `bos_token`, if any.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// `tokenizer_config.json`'s `eos_token`, if any.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    pub fn defaults(&self) -> &GenerationDefaults {
        &self.defaults
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The id of `content` where the tokenizer has it as one special added token (Llama 3.1's
    /// `<|python_tag|>`, Mistral's `[TOOL_CALLS]`): such a token decodes to no text in an
    /// output, so a grammar must name it by id rather than spell it.
    pub fn special_token_id(&self, content: &str) -> Option<u32> {
        self.tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .find(|(_, token)| token.special && token.content == content)
            .map(|(id, _)| id)
    }
}

/// A special token in `tokenizer_config.json`: a string, or an AddedToken object
/// `{"content": "<s>", "lstrip": false, ...}`.
fn token_content(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_owned),
        _ => None,
    }
}
