//! What the client subcommands (`generate`, `audit`) share: where the coordinator is, the
//! bearer token, and the prompt.

use clap::Args;
use specd_proto::v1::TokenIds;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::generation_client::GenerationClient;
use tonic::transport::Channel;

use crate::cli_error::invalid;

#[derive(Debug, Args)]
pub struct ClientArgs {
    /// The coordinator's URL.
    #[arg(long, env = "SPECD_ENDPOINT", default_value = "http://127.0.0.1:50051")]
    pub endpoint: String,
    /// Bearer token, for a coordinator started with --api-token.
    #[arg(long, env = "SPECD_CLIENT_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// The prompt as text (tokenised by the model's tokenizer).
    #[arg(long, env = "SPECD_PROMPT", conflicts_with = "token_ids", required_unless_present = "token_ids")]
    pub prompt: Option<String>,
    /// The prompt as token ids, comma-separated.
    #[arg(long, env = "SPECD_TOKEN_IDS", value_delimiter = ',')]
    pub token_ids: Option<Vec<u32>>,
}

impl ClientArgs {
    /// The prompt as the request carries it.
    pub fn prompt(&self) -> Prompt {
        match (&self.prompt, &self.token_ids) {
            (Some(text), _) => Prompt::Text(text.clone()),
            (None, ids) => Prompt::TokenIds(TokenIds { ids: ids.clone().unwrap_or_default() }),
        }
    }

    pub async fn connect(&self) -> anyhow::Result<GenerationClient<Channel>> {
        GenerationClient::connect(self.endpoint.clone())
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach the coordinator at {}: {e}", self.endpoint))
    }

    /// `message` with `authorization: Bearer <token>` when there is a token.
    pub fn request<T>(&self, message: T) -> anyhow::Result<tonic::Request<T>> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.api_token {
            let value =
                format!("Bearer {token}").parse().map_err(|_| invalid("--api-token must be printable ASCII"))?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}
