//! The public `Generation` service: validation, one session actor per request, and the
//! registry of generations in flight.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use dashmap::DashMap;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::generation_server::Generation;
use specd_proto::v1::{GenerateRequest, GenerateResponse, NextTokenLawRequest, NextTokenLawResponse};
use specd_telemetry::CoordinatorMetrics;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Extensions, Request, Response, Status};

use specd_telemetry::attributes;
use specd_telemetry::propagation::{extract_from_metadata, set_remote_parent};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use specd_proto::tls::ServerTls;

use crate::api::admission::{Admission, deadline};
use crate::error::CoordinatorError;
use crate::nodes::prefix_routes::PromptBlocks;
use crate::nodes::{ModelFacts, NodePool, Picked};
use crate::policy::PolicyMemory;
use crate::request::{Defaults, GenerationSpec, validate, validate_law_request};
use crate::session::{RunningCount, SessionActor};
use crate::text::off_the_runtime;
use specd_text::{ChatMessage, ChatTool};

/// A generation in flight, for operators.
#[derive(Debug, Clone)]
pub struct ActiveGeneration {
    pub request_id: String,
    pub started: Instant,
}

/// The coordinator's shared state.
#[derive(Debug, Clone)]
pub struct GenerationService {
    pool: Arc<NodePool>,
    defaults: Defaults,
    active: Arc<DashMap<String, ActiveGeneration>>,
    next_id: Arc<AtomicU64>,
    policy_memory: PolicyMemory,
    instance: u64,
    metrics: Option<CoordinatorMetrics>,
    server_tls: ServerTls,
    admission: Admission,
}

/// Removes a generation from the registry when its actor ends.
struct Registered {
    active: Arc<DashMap<String, ActiveGeneration>>,
    session_id: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.active.remove(&self.session_id);
    }
}

impl GenerationService {
    pub fn new(pool: NodePool, defaults: Defaults) -> Self {
        Self {
            pool: Arc::new(pool),
            defaults,
            active: Arc::default(),
            next_id: Arc::default(),
            policy_memory: PolicyMemory::default(),
            instance: RandomState::new().hash_one(std::process::id()),
            metrics: None,
            server_tls: ServerTls::default(),
            admission: Admission::default(),
        }
    }

    /// Serves its API with this TLS (none by default).
    pub fn with_server_tls(self, tls: ServerTls) -> Self {
        Self { server_tls: tls, ..self }
    }

    /// Admits requests by these rules (by default: everyone, any number).
    pub fn with_admission(self, admission: Admission) -> Self {
        Self { admission, ..self }
    }

    pub fn server_tls(&self) -> &ServerTls {
        &self.server_tls
    }

    /// Records rounds, tokens, latencies and finish reasons into `metrics`.
    pub fn with_metrics(self, metrics: CoordinatorMetrics) -> Self {
        Self { metrics: Some(metrics), ..self }
    }

    /// Generations in flight.
    pub fn active(&self) -> Vec<ActiveGeneration> {
        self.active.iter().map(|e| e.value().clone()).collect()
    }

    pub(crate) fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Whether one more generation may start now (the check `start` makes again).
    pub(crate) fn admit_now(&self) -> Result<(), Status> {
        self.admission.admit(self.active.len())
    }

    pub(crate) fn facts(&self) -> &ModelFacts {
        &self.pool.facts
    }

    /// A chat rendered by the model's template, offering `tools` (none when empty), with the
    /// assistant's turn opened, as ids.
    pub(crate) async fn chat_prompt(
        &self,
        messages: Vec<ChatMessage>,
        tools: Vec<ChatTool>,
    ) -> Result<Vec<u32>, CoordinatorError> {
        let text = self.pool.facts.text.as_ref().ok_or_else(|| {
            CoordinatorError::InvalidRequest("the target model has no tokenizer, so no chat template".into())
        })?;
        // What decides whether rendering and encoding leave the runtime: the text's size.
        let bytes = messages.iter().map(|m| m.content.as_ref().map_or(0, String::len)).sum::<usize>()
            + tools.iter().map(|t| t.function.parameters.as_ref().map_or(0, |p| p.to_string().len())).sum::<usize>();
        off_the_runtime(text, bytes, move |text| Ok(text.chat_prompt_ids(&messages, &tools, true)?)).await
    }

    /// The request with the model's generation defaults filled in where it left them unset;
    /// the prompt, already read, is left out.
    fn with_model_defaults(&self, request: &GenerateRequest) -> GenerateRequest {
        let mut sampling = request.sampling.unwrap_or_default();
        if let (true, Some(text)) = (self.defaults.generation_config, &self.pool.facts.text) {
            crate::text::apply_defaults(&mut sampling, text.defaults());
        }
        GenerateRequest {
            request_id: request.request_id.clone(),
            prompt: None,
            sampling: Some(sampling),
            stopping: request.stopping.clone(),
            speculation: request.speculation,
            logprobs: request.logprobs,
            cache_salt: request.cache_salt.clone(),
            constraint: request.constraint.clone(),
        }
    }

    /// Whether a target node is there to take a generation.
    pub(crate) fn pool_ready(&self) -> Result<(), CoordinatorError> {
        self.pool.ready()
    }

    /// Starts a generation for another face of the API (HTTP), with the caller's metadata
    /// (its bearer token, trace context) as a gRPC client would send it.
    pub(crate) async fn start_with(
        &self,
        metadata: MetadataMap,
        request: GenerateRequest,
    ) -> Result<ReceiverStream<Result<GenerateResponse, Status>>, Status> {
        self.start(&Request::from_parts(metadata, Extensions::default(), request)).await
    }

    async fn start(
        &self,
        request: &Request<GenerateRequest>,
    ) -> Result<ReceiverStream<Result<GenerateResponse, Status>>, Status> {
        let (metadata, request) = (request.metadata(), request.get_ref());
        self.admission.authorize(metadata)?;
        self.admission.admit(self.active.len())?;
        let deadline = deadline(metadata, Instant::now());
        let metrics = self.metrics.as_ref().map(CoordinatorMetrics::request_started);
        self.pool.ready()?;
        let prompt = match (&request.prompt, &self.pool.facts.text) {
            (Some(Prompt::TokenIds(ids)), _) => ids.ids.clone(),
            (Some(Prompt::Text(_)), None) => {
                return Err(CoordinatorError::InvalidRequest(
                    "the target model has no tokenizer: send token_ids instead of text".into(),
                )
                .into());
            }
            (Some(Prompt::Text(text)), Some(model)) => {
                let text = text.clone();
                off_the_runtime(model, text.len(), move |model| Ok(model.encode(&text, true)?)).await?
            }
            (None, _) => return Err(CoordinatorError::InvalidRequest("the prompt is empty".into()).into()),
        };
        let request = &self.with_model_defaults(request);
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let session_id = format!("{:016x}-{n}", self.instance);
        let random_seed = || RandomState::new().hash_one(n);
        let mut spec = validate(request, prompt, &self.pool.facts, &self.defaults, random_seed)?;
        if spec.request_id.is_empty() {
            spec.request_id.clone_from(&session_id);
        }
        let Picked { target, draft, target_route, target_lease } =
            self.pool.pick(&PromptBlocks::of(&spec.cache_salt, &spec.prompt), spec.gamma.max() > 0)?;
        let (out, rx) = mpsc::channel(16);
        self.active.insert(
            session_id.clone(),
            ActiveGeneration { request_id: spec.request_id.clone(), started: Instant::now() },
        );
        let registered = Registered { active: Arc::clone(&self.active), session_id: session_id.clone() };
        // Every log line and span of this generation carries its request id; the span is the
        // root of the generation's trace, or a child of the client's when it sent one.
        let span = tracing::info_span!("generation", request_id = %spec.request_id, session = %session_id);
        set_remote_parent(&span, extract_from_metadata(metadata));
        record_request(&span, &spec, &self.pool.facts);
        let vocab_size = self.pool.facts.vocab_size;
        let spare_targets = self.pool.spare_targets(&target);
        let active = Arc::clone(&self.active);
        let (policy_memory, running) = (self.policy_memory.clone(), RunningCount(Arc::new(move || active.len())));
        let actor = SessionActor {
            session_id,
            spec,
            vocab_size,
            target,
            spare_targets,
            target_route,
            draft,
            out,
            metrics,
            deadline,
            policy_memory,
            running,
            text: self.pool.facts.text.clone(),
        };
        tokio::spawn(
            async move {
                let releases = actor.run().await;
                // No longer running: the next request of a client that sends one at a time
                // must not start as if it ran alongside this one.
                drop(registered);
                if let Some(releases) = releases {
                    releases.release().await;
                }
                // The target replica serves one generation fewer once it holds nothing there
                // (the draft's lease goes with the draft's releases).
                drop(target_lease);
                // The stream closes here, once the nodes hold nothing of the generation.
                drop(actor);
            }
            .instrument(span),
        );
        Ok(ReceiverStream::new(rx))
    }
}

/// Adds a streamed message to the whole generation: its tokens and text appended, the last
/// message's finish reason, usage and stats kept.
pub(crate) fn merge(all: &mut GenerateResponse, message: GenerateResponse) {
    all.token_ids.extend(message.token_ids);
    all.text.push_str(&message.text);
    all.request_id = message.request_id;
    all.finish_reason = message.finish_reason;
    all.logprobs.extend(message.logprobs);
    all.usage = message.usage.or(all.usage.take());
    all.stats = message.stats.or(all.stats.take());
}

/// The request span's attributes known at the start; the session adds usage and the finish
/// reason at the end.
fn record_request(span: &tracing::Span, spec: &GenerationSpec, facts: &ModelFacts) {
    span.set_attribute(attributes::OPERATION_NAME, "text_completion");
    span.set_attribute(attributes::REQUEST_ID, spec.request_id.clone());
    span.set_attribute(attributes::REQUEST_MODEL, facts.target_model.clone());
    if let Some(draft) = &facts.draft_model {
        span.set_attribute(attributes::DRAFT_MODEL, draft.clone());
    }
    span.set_attribute(attributes::REQUEST_TEMPERATURE, spec.params.temperature);
    span.set_attribute(attributes::REQUEST_TOP_P, spec.params.top_p);
    span.set_attribute(attributes::REQUEST_TOP_K, i64::from(spec.params.top_k));
    span.set_attribute(attributes::REQUEST_MAX_TOKENS, spec.max_new_tokens as i64);
    span.set_attribute(attributes::REQUEST_SEED, spec.seed as i64);
    span.set_attribute(attributes::USAGE_INPUT_TOKENS, spec.prompt.len() as i64);
}

#[tonic::async_trait]
impl Generation for GenerationService {
    type GenerateStreamStream = ReceiverStream<Result<GenerateResponse, Status>>;

    async fn generate_stream(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStreamStream>, Status> {
        Ok(Response::new(self.start(&request).await?))
    }

    async fn generate(&self, request: Request<GenerateRequest>) -> Result<Response<GenerateResponse>, Status> {
        let mut stream = self.start(&request).await?;
        let mut all = GenerateResponse::default();
        while let Some(message) = stream.next().await {
            merge(&mut all, message?);
        }
        Ok(Response::new(all))
    }

    async fn next_token_law(
        &self,
        request: Request<NextTokenLawRequest>,
    ) -> Result<Response<NextTokenLawResponse>, Status> {
        self.admission.authorize(request.metadata())?;
        let law_request = validate_law_request(request.get_ref(), &self.pool.facts)?;
        let target = self.pool.any_target()?;
        let law = target.target_law(law_request).await?;
        Ok(Response::new(NextTokenLawResponse { token_ids: law.token_ids, probs: law.probs }))
    }
}
