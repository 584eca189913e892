//! The OpenAI-compatible HTTP API, a second face of [`GenerationService`]: every request
//! becomes a gRPC `GenerateRequest` and runs through the same validation, admission, session
//! actor and rule.
//!
//! - `body`: which fields are honoured, which refused by name, and their types;
//! - `messages`: a chat's `messages` (with tool calls and tools' results) as the chat
//!   template's messages;
//! - `constraint`: the output constraint fields (`response_format`, `structured_outputs`,
//!   `guided_*`) as one `OutputConstraint`;
//! - `tools`: `tools`, `tool_choice` and `parallel_tool_calls`: the tools the template offers,
//!   and the grammar that makes the model call one where a call is required;
//! - `translate`: a body into a `GenerateRequest`;
//! - `calls`: the tool calls read from an output in the model's format, as OpenAI's
//!   `tool_calls` and their stream deltas;
//! - `respond`: OpenAI's response and chunk shapes;
//! - `stream`: server-sent events, one chunk per committed round, then `[DONE]`;
//! - `error`: OpenAI's error shape and the HTTP status of each gRPC code.
//!
//! Tools need to know the syntax the model writes calls in ([`ToolCallFormat`]): the
//! `--tool-call-format` the server was started with, else the one its chat template shows
//! ([`ToolCallFormat::detect`]).

mod body;
mod calls;
mod constraint;
mod error;
mod messages;
mod respond;
mod stream;
mod tools;
mod translate;

use std::future::Future;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use specd_proto::v1::GenerateResponse;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::{GenerateRequest, TokenIds};
use specd_text::{ChatTool, ToolCallFormat};
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tonic::metadata::MetadataMap;

use crate::api::grpc::GenerationService;
use crate::error::CoordinatorError;

use body::Body;
pub use body::Endpoint;
use calls::CallReader;
pub use error::{ApiError, http_status};
use respond::{LogprobFormat, Shape};
use tools::Tools;
use translate::{HttpRequest, PromptSource, translate};

/// How the HTTP API presents itself.
#[derive(Debug, Clone, Default)]
pub struct HttpConfig {
    /// The `model` clients must name; `None`: the target model's name (its directory's).
    pub served_model_name: Option<String>,
    /// The syntax the model writes tool calls in; `None`: the one its chat template shows.
    pub tool_call_format: Option<ToolCallFormat>,
}

#[derive(Debug, Clone)]
struct Api {
    service: GenerationService,
    served: Arc<str>,
    /// When this server started: the `created` of its one model.
    started: u64,
    /// The syntax of the model's tool calls, if known.
    tool_format: Option<ToolCallFormat>,
    /// The format's marker where the tokenizer has it as a special token.
    marker_token: Option<u32>,
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The router, for [`serve`] and for tests that drive it without a socket.
pub fn router(service: GenerationService, config: &HttpConfig) -> Router {
    let served = config.served_model_name.clone().unwrap_or_else(|| service.facts().target_model.clone());
    let text = service.facts().text.clone();
    let tool_format = config.tool_call_format.or_else(|| {
        let template = text.as_ref()?.chat_template()?;
        ToolCallFormat::detect(template.source())
    });
    let marker_token = tool_format.and_then(|format| text.as_ref()?.special_token_id(format.marker()));
    let api = Api { service, served: served.into(), started: unix_now(), tool_format, marker_token };
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .fallback(not_found)
        .with_state(api)
}

/// Serves the HTTP API on `listener` until `shutdown`, then waits for the requests in flight.
pub async fn serve(
    listener: TcpListener,
    service: GenerationService,
    config: &HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), CoordinatorError> {
    axum::serve(listener, router(service, config))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| CoordinatorError::InvalidConfig(format!("the HTTP server failed: {e}")))
}

/// 200 while a target node is there to serve, 503 otherwise.
async fn health(State(api): State<Api>) -> Response {
    match api.service.pool_ready() {
        Ok(()) => Json(json!({"status": "ok"})).into_response(),
        Err(err) => ApiError::from(err).into_response(),
    }
}

async fn models(State(api): State<Api>, headers: HeaderMap) -> Result<Response, ApiError> {
    api.service.admission().authorize(&MetadataMap::from_headers(headers))?;
    let facts = api.service.facts();
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": &*api.served,
            "object": "model",
            "created": api.started,
            "owned_by": "specd",
            "max_model_len": facts.context_length,
        }],
    }))
    .into_response())
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "no such route: specd serves /v1/models, /v1/completions, /v1/chat/completions and /health".into(),
        param: None,
        code: None,
    }
}

async fn completions(State(api): State<Api>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    api.generate(Endpoint::Completions, headers, &body).await
}

async fn chat_completions(State(api): State<Api>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    api.generate(Endpoint::Chat, headers, &body).await
}

impl Api {
    async fn generate(&self, endpoint: Endpoint, headers: HeaderMap, bytes: &[u8]) -> Result<Response, ApiError> {
        let metadata = MetadataMap::from_headers(headers);
        // The token is checked before anything of the body is read or answered.
        self.service.admission().authorize(&metadata)?;
        let HttpRequest { model, prompt, generate, stream, include_usage, logprobs, tools, mut constraint_field } =
            translate(&Body::parse(bytes, endpoint)?, endpoint)?;
        if model != *self.served {
            return Err(ApiError::model_not_found(&model, &self.served));
        }
        // A request that will be refused for the limit is refused before its prompt is
        // rendered and tokenised.
        self.service.admit_now()?;
        let offered = tools.as_ref().map(Tools::offered).unwrap_or_default();
        let mut generate = self.with_prompt(generate, prompt, offered, metadata.get("x-request-id")).await?;
        let calls = self.tool_calls(tools.as_ref(), &mut generate)?;
        if generate.constraint.is_some() && constraint_field.is_none() {
            constraint_field = Some("tools");
        }
        let served = self.served.to_string();
        let shape = move |request_id: &str| Shape::new(endpoint, request_id, unix_now(), served);
        let generation = self
            .service
            .start_with(metadata, generate)
            .await
            .map_err(|status| ApiError::from(status).naming_constraint(constraint_field))?;
        let logprobs = logprobs.then(|| LogprobFormat::new(endpoint, self.service.facts().text.clone()));
        if stream {
            Ok(stream::events(generation, shape, include_usage, logprobs, calls).into_response())
        } else {
            let all = collect(generation).await?;
            let formatted = logprobs.map(|mut f| f.format(&all.token_ids, &all.logprobs));
            Ok(Json(shape(&all.request_id).whole(&all, formatted, calls)).into_response())
        }
    }

    /// What the request's tools do to its generation: where a call is required, the output
    /// is constrained to calls; where the model may call tools, its output is read for them.
    /// An `auto` request that carries another constraint has an output in that constraint's
    /// language, in which no call is written, so nothing is read.
    fn tool_calls(
        &self,
        tools: Option<&Tools>,
        generate: &mut GenerateRequest,
    ) -> Result<Option<CallReader>, ApiError> {
        let Some(tools) = tools.filter(|t| t.reads_calls()) else { return Ok(None) };
        let format = self.tool_format.ok_or_else(|| {
            ApiError::invalid(
                "this model's chat template shows no tool-call format (Hermes <tool_call>, Llama 3.1 JSON, Mistral \
                 [TOOL_CALLS]); the server must be started with --tool-call-format to serve tools",
                Some("tools"),
            )
        })?;
        match tools.constraint(format, self.marker_token) {
            Some(constraint) => generate.constraint = Some(constraint),
            None if generate.constraint.is_some() => return Ok(None),
            None => {}
        }
        Ok(Some(CallReader::new(format, tools.max_calls())))
    }

    /// The gRPC request with its prompt: text or ids as sent, or a chat rendered by the
    /// model's template (offered `tools`) and tokenised here.
    async fn with_prompt(
        &self,
        mut generate: GenerateRequest,
        prompt: PromptSource,
        tools: Vec<ChatTool>,
        request_id: Option<&tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    ) -> Result<GenerateRequest, ApiError> {
        generate.request_id = request_id.and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        generate.prompt = Some(match prompt {
            PromptSource::Completion(prompt) => prompt,
            PromptSource::Chat(messages) => {
                Prompt::TokenIds(TokenIds { ids: self.service.chat_prompt(messages, tools).await? })
            }
        });
        Ok(generate)
    }
}

/// Reads a request body as the endpoint does, up to the prompt (which needs the model):
/// what the fuzz targets drive.
pub fn check_request(endpoint: Endpoint, bytes: &[u8]) -> Result<(), ApiError> {
    translate(&Body::parse(bytes, endpoint)?, endpoint).map(drop)
}

/// Every message of a generation as one, as the gRPC API's unary `Generate` does.
async fn collect(
    mut generation: impl tokio_stream::Stream<Item = Result<GenerateResponse, tonic::Status>> + Unpin,
) -> Result<GenerateResponse, ApiError> {
    let mut all = GenerateResponse::default();
    while let Some(message) = generation.next().await {
        crate::api::grpc::merge(&mut all, message?);
    }
    Ok(all)
}
