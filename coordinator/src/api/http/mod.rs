//! The OpenAI-compatible HTTP API, a second face of [`GenerationService`]: every request
//! becomes a gRPC `GenerateRequest` and runs through the same validation, admission, session
//! actor and rule.
//!
//! - `body`: which fields are honoured, which refused by name, and their types;
//! - `translate`: a body into a `GenerateRequest`;
//! - `respond`: OpenAI's response and chunk shapes;
//! - `stream`: server-sent events, one chunk per committed round, then `[DONE]`;
//! - `error`: OpenAI's error shape and the HTTP status of each gRPC code.

mod body;
mod error;
mod respond;
mod stream;
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
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tonic::metadata::MetadataMap;

use crate::api::grpc::GenerationService;
use crate::error::CoordinatorError;

use body::Body;
pub use body::Endpoint;
pub use error::{ApiError, http_status};
use respond::{LogprobFormat, Shape};
use translate::{HttpRequest, PromptSource, translate};

/// How the HTTP API presents itself.
#[derive(Debug, Clone, Default)]
pub struct HttpConfig {
    /// The `model` clients must name; `None`: the target model's name (its directory's).
    pub served_model_name: Option<String>,
}

#[derive(Debug, Clone)]
struct Api {
    service: GenerationService,
    served: Arc<str>,
    /// When this server started: the `created` of its one model.
    started: u64,
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The router, for [`serve`] and for tests that drive it without a socket.
pub fn router(service: GenerationService, config: &HttpConfig) -> Router {
    let served = config.served_model_name.clone().unwrap_or_else(|| service.facts().target_model.clone());
    let api = Api { service, served: served.into(), started: unix_now() };
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
        let HttpRequest { model, prompt, generate, stream, include_usage, logprobs } =
            translate(&Body::parse(bytes, endpoint)?, endpoint)?;
        if model != *self.served {
            return Err(ApiError::model_not_found(&model, &self.served));
        }
        // A request that will be refused for the limit is refused before its prompt is
        // rendered and tokenised.
        self.service.admit_now()?;
        let generate = self.with_prompt(generate, prompt, metadata.get("x-request-id")).await?;
        let served = self.served.to_string();
        let shape = move |request_id: &str| Shape::new(endpoint, request_id, unix_now(), served);
        let generation = self.service.start_with(metadata, generate).await?;
        let logprobs = logprobs.then(|| LogprobFormat::new(endpoint, self.service.facts().text.clone()));
        if stream {
            Ok(stream::events(generation, shape, include_usage, logprobs).into_response())
        } else {
            let all = collect(generation).await?;
            let formatted = logprobs.map(|mut f| f.format(&all.token_ids, &all.logprobs));
            Ok(Json(shape(&all.request_id).whole(&all, formatted)).into_response())
        }
    }

    /// The gRPC request with its prompt: text or ids as sent, or a chat rendered by the
    /// model's template and tokenised here.
    async fn with_prompt(
        &self,
        mut generate: GenerateRequest,
        prompt: PromptSource,
        request_id: Option<&tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    ) -> Result<GenerateRequest, ApiError> {
        generate.request_id = request_id.and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        generate.prompt = Some(match prompt {
            PromptSource::Completion(prompt) => prompt,
            PromptSource::Chat(messages) => {
                Prompt::TokenIds(TokenIds { ids: self.service.chat_prompt(messages).await? })
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
