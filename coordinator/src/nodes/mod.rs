//! Typed clients of the draft and target nodes, and the pool the coordinator balances over.

pub mod discovery;
pub mod load;
pub mod prefix_routes;
pub mod round_stream;
mod vocab;

use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use specd_proto::v1::draft_service_client::DraftServiceClient;
use specd_proto::v1::target_service_client::TargetServiceClient;
use specd_proto::v1::{
    InfoRequest, NodeInfo, OpenSessionRequest, ProposeRequest, ProposeResponse, ReleaseRequest, TargetLawRequest,
    TargetLawResponse, TextAssetsRequest, TextAssetsResponse, VerifyRequest, VerifyResponse,
};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status, Streaming};

use specd_ngram::MatchSpan;
use specd_proto::in_process::{LocalDraft, LocalTarget, ServesRounds};
use specd_proto::tls::ClientTls;

use crate::error::CoordinatorError;
use crate::nodes::discovery::{Dialing, Discovery, NodeAddress, Reference, Replica, Replicas, Watcher};
use crate::nodes::load::{ReplicaLease, ReplicaLoads, choose};
use crate::nodes::prefix_routes::{DEFAULT_CAPACITY, PrefixRoutes, PromptBlocks, RouteNote};
use crate::nodes::round_stream::{RoundStream, node_error};
use specd_grammar::GrammarVocabulary;
use specd_telemetry::propagation::inject_into_metadata;
use specd_text::ModelText;

/// One node: its role, address and client, and its handle where this process serves it.
#[derive(Debug, Clone)]
pub struct NodeClient<C, L> {
    pub role: &'static str,
    pub address: String,
    client: C,
    timeout: Duration,
    /// Round streams go through this handle instead of gRPC (`specd_proto::in_process`).
    in_process: Option<L>,
}

pub type DraftClient = NodeClient<DraftServiceClient<Channel>, LocalDraft>;
pub type TargetClient = NodeClient<TargetServiceClient<Channel>, LocalTarget>;

async fn channel(
    role: &'static str,
    address: &str,
    timeout: Duration,
    tls: &ClientTls,
) -> Result<Channel, CoordinatorError> {
    let unreachable = |message: String| CoordinatorError::Unreachable { role, address: address.to_owned(), message };
    let mut endpoint = Endpoint::from_shared(address.to_owned())
        .map_err(|e| unreachable(format!("not a valid URL: {e}")))?
        .connect_timeout(timeout)
        .tcp_nodelay(true);
    let host = endpoint.uri().host().unwrap_or_default().to_owned();
    if let Some(config) = tls.config(&host).map_err(|e| CoordinatorError::InvalidConfig(e.to_string()))? {
        endpoint = endpoint.tls_config(config).map_err(|e| unreachable(format!("TLS: {e}")))?;
    }
    endpoint.connect().await.map_err(|e| unreachable(e.to_string()))
}

impl<C: Clone, L> NodeClient<C, L> {
    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(self.timeout);
        inject_into_metadata(request.metadata_mut());
        request
    }

    fn error(&self, status: Status) -> CoordinatorError {
        node_error(self.role, &self.address, status)
    }

    /// Opens a round stream: through the node's handle where this process serves it, else
    /// with `open` over gRPC, waiting at most the node timeout for the node to accept it.
    async fn open_stream<Q, R, F, Fut>(&self, open: F) -> Result<RoundStream<Q, R>, CoordinatorError>
    where
        Q: Send + 'static,
        R: Send + 'static,
        L: Deref<Target = dyn ServesRounds<Q, R>>,
        F: FnOnce(C, Request<ReceiverStream<Q>>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Streaming<R>>, Status>>,
    {
        let (requests, rx) = mpsc::channel(1);
        let stream = |replies| RoundStream::new(self.role, self.address.clone(), self.timeout, requests, replies);
        if let Some(node) = &self.in_process {
            return Ok(stream(node.answer_rounds(Box::pin(ReceiverStream::new(rx).map(Ok)))));
        }
        // No deadline on the stream itself: it lives as long as the session.
        let mut request = Request::new(ReceiverStream::new(rx));
        inject_into_metadata(request.metadata_mut());
        let opened = tokio::time::timeout(self.timeout, open(self.client.clone(), request))
            .await
            .map_err(|_| self.error(Status::deadline_exceeded(format!("no stream within {:?}", self.timeout))))?;
        let replies = opened.map_err(|s| self.error(s))?.into_inner();
        Ok(stream(Box::pin(replies)))
    }
}

pub type DraftRounds = RoundStream<ProposeRequest, ProposeResponse>;
pub type TargetRounds = RoundStream<VerifyRequest, VerifyResponse>;

/// What a draft says of how it proposes, as it opens a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftOpened {
    /// It proposes only after an n-gram match of these lengths
    /// (`OpenSessionResponse.proposes_only_after_match`).
    pub proposes_only_after_match: Option<MatchSpan>,
    /// It draws from its model and copies n-gram matches too
    /// (`OpenSessionResponse.copies_besides_model`).
    pub copies_besides_model: bool,
    /// It draws trees from its model (`OpenSessionResponse.draws_trees`).
    pub draws_trees: bool,
    /// Prompt tokens it found in its prefix cache (`OpenSessionResponse.cached_tokens`).
    pub cached_tokens: usize,
}

/// What a target said of a session it opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetOpened {
    /// It scores trees (`OpenSessionResponse.scores_trees`).
    pub scores_trees: bool,
    /// Prompt tokens it found in its prefix cache (`OpenSessionResponse.cached_tokens`).
    pub cached_tokens: usize,
}

impl DraftClient {
    /// Connects to the draft at `address`; its round streams go in process where this
    /// process serves it (`dialing.in_process`).
    pub async fn connect(address: &str, dialing: &Dialing) -> Result<Self, CoordinatorError> {
        let client = DraftServiceClient::new(channel("draft", address, dialing.timeout, &dialing.tls).await?);
        let (timeout, in_process) = (dialing.timeout, dialing.in_process.draft(address));
        Ok(Self { role: "draft", address: address.to_owned(), client, timeout, in_process })
    }

    pub async fn info(&self) -> Result<NodeInfo, CoordinatorError> {
        let reply = self.client.clone().info(self.request(InfoRequest {})).await;
        reply.map(tonic::Response::into_inner).map_err(|s| self.error(s))
    }

    /// Opens a session; returns what the draft said of how it proposes.
    pub async fn open_session(&self, request: OpenSessionRequest) -> Result<DraftOpened, CoordinatorError> {
        let reply = self.client.clone().open_session(self.request(request)).await.map_err(|s| self.error(s))?;
        let reply = reply.into_inner();
        let copies_besides_model = reply.copies_besides_model;
        let proposes_only_after_match = reply.proposes_only_after_match.and_then(|span| {
            MatchSpan::new(span.min as usize, span.max as usize)
                .inspect_err(|why| {
                    // Only a chance to skip a round is lost: ask the draft every round.
                    tracing::warn!(address = %self.address, %why, "the draft announced n-gram lengths that make no sense");
                })
                .ok()
        });
        Ok(DraftOpened {
            proposes_only_after_match,
            copies_besides_model,
            draws_trees: reply.draws_trees,
            cached_tokens: reply.cached_tokens as usize,
        })
    }

    /// The session's round stream.
    pub async fn open_rounds(&self) -> Result<DraftRounds, CoordinatorError> {
        self.open_stream(|mut client, requests| async move { client.propose_stream(requests).await }).await
    }

    /// Releases a session; `last`: where the node's copy of the committed sequence stands
    /// (the rollback point and the tokens committed since), so that it ends complete.
    pub async fn release(&self, session_id: String, last: Option<(usize, &[u32])>) -> Result<bool, CoordinatorError> {
        let reply = self.client.clone().release(self.request(release_request(session_id, last))).await;
        reply.map(|r| r.into_inner().existed).map_err(|s| self.error(s))
    }
}

impl TargetClient {
    /// Connects to the target at `address`; its round streams go in process where this
    /// process serves it (`dialing.in_process`).
    pub async fn connect(address: &str, dialing: &Dialing) -> Result<Self, CoordinatorError> {
        let client = TargetServiceClient::new(channel("target", address, dialing.timeout, &dialing.tls).await?);
        let (timeout, in_process) = (dialing.timeout, dialing.in_process.target(address));
        Ok(Self { role: "target", address: address.to_owned(), client, timeout, in_process })
    }

    pub async fn info(&self) -> Result<NodeInfo, CoordinatorError> {
        let reply = self.client.clone().info(self.request(InfoRequest {})).await;
        reply.map(tonic::Response::into_inner).map_err(|s| self.error(s))
    }

    /// Opens a session; returns what the target said of it.
    pub async fn open_session(&self, request: OpenSessionRequest) -> Result<TargetOpened, CoordinatorError> {
        let reply = self.client.clone().open_session(self.request(request)).await.map_err(|s| self.error(s))?;
        let reply = reply.into_inner();
        Ok(TargetOpened { scores_trees: reply.scores_trees, cached_tokens: reply.cached_tokens as usize })
    }

    /// The session's round stream.
    pub async fn open_rounds(&self) -> Result<TargetRounds, CoordinatorError> {
        self.open_stream(|mut client, requests| async move { client.verify_stream(requests).await }).await
    }

    /// Releases a session; `last`: where the node's copy of the committed sequence stands (the
    /// rollback point and the tokens committed since), so that its prefix cache keeps the
    /// rows of exactly the committed tokens. `None` (a session lost or failed): nothing is
    /// kept.
    pub async fn release(&self, session_id: String, last: Option<(usize, &[u32])>) -> Result<bool, CoordinatorError> {
        let reply = self.client.clone().release(self.request(release_request(session_id, last))).await;
        reply.map(|r| r.into_inner().existed).map_err(|s| self.error(s))
    }

    pub async fn target_law(&self, request: TargetLawRequest) -> Result<TargetLawResponse, CoordinatorError> {
        let reply = self.client.clone().target_law(self.request(request)).await;
        reply.map(tonic::Response::into_inner).map_err(|s| self.error(s))
    }

    /// The model directory's text files. A tokenizer.json may be larger than gRPC's default
    /// 4 MiB message (Llama 3's is 9 MB): this one call takes up to 256 MiB.
    pub async fn text_assets(&self) -> Result<TextAssetsResponse, CoordinatorError> {
        let mut client = self.client.clone().max_decoding_message_size(256 << 20);
        let reply = client.text_assets(self.request(TextAssetsRequest {})).await;
        reply.map(tonic::Response::into_inner).map_err(|s| self.error(s))
    }
}

/// A release of `session_id`, with where the node's copy of the committed sequence stands
/// (`last`: the rollback point and the tokens committed since) when the generation knows it.
fn release_request(session_id: String, last: Option<(usize, &[u32])>) -> ReleaseRequest {
    ReleaseRequest {
        session_id,
        rollback_to: last.map(|(valid, _)| valid as u32),
        pending_token_ids: last.map(|(_, pending)| pending.to_vec()).unwrap_or_default(),
    }
}

/// What every node of the cluster agrees on, checked at startup.
#[derive(Debug, Clone)]
pub struct ModelFacts {
    pub vocab_size: usize,
    pub context_length: usize,
    pub eos_token_ids: Vec<u32>,
    pub tokenizer_fingerprint: String,
    pub target_model: String,
    pub draft_model: Option<String>,
    /// The target model's text side (tokenizer, chat template, generation defaults): the
    /// coordinator tokenises prompts and decodes output with it. `None`: the target has no
    /// tokenizer (a table model), and requests must send token ids.
    pub text: Option<Arc<ModelText>>,
    /// `text` is there.
    pub has_tokenizer: bool,
    /// The target's vocabulary as the grammar engine reads it, for output constraints; why
    /// there is none otherwise (no tokenizer, or one the engine cannot read).
    pub constraints: Result<Arc<GrammarVocabulary>, String>,
}

/// Every node the coordinator uses. A new session goes, in each role, to the replica that
/// holds its prompt's prefix ([`prefix_routes`]) unless that one carries more than its share,
/// else to the least loaded ([`load`]), over the replicas as discovered now
/// ([`crate::nodes::discovery`]).
#[derive(Debug)]
pub struct NodePool {
    targets: Replicas<TargetClient>,
    drafts: Replicas<DraftClient>,
    target_routes: Arc<PrefixRoutes>,
    draft_routes: Arc<PrefixRoutes>,
    target_loads: ReplicaLoads,
    draft_loads: Arc<ReplicaLoads>,
    /// Whose turn it is among equally loaded replicas.
    next: AtomicUsize,
    pub facts: ModelFacts,
}

/// The replicas a new session uses, and what it holds while it runs.
#[derive(Debug)]
pub struct Picked {
    pub target: TargetClient,
    pub draft: Option<DraftChoice>,
    /// Records where the target session opened (or moved to on a failover).
    pub target_route: RouteNote,
    /// The session counted on its target replica until this is dropped, once it has
    /// released its node sessions.
    pub target_lease: ReplicaLease,
}

/// The draft replica a new session would draft on. It counts there, and is recorded as
/// holding the prompt, only once the session opens there ([`DraftChoice::engage`]): a
/// generation whose adaptive policy starts it without drafting touches neither until it
/// files its turn there at its end (`crate::session::draft_filing`), so the draft replicas'
/// loads and routes say where draft sessions and filed turns are.
#[derive(Debug, Clone)]
pub struct DraftChoice {
    pub client: DraftClient,
    routes: Arc<PrefixRoutes>,
    loads: Arc<ReplicaLoads>,
    prompt: PromptBlocks,
}

impl DraftChoice {
    /// The session opens on this replica: later prompts sharing its prefix are routed here,
    /// and it counts on the replica until the lease is dropped (a draft session never moves).
    pub fn engage(&self) -> ReplicaLease {
        self.routes.record(&self.prompt, &self.client.address);
        self.loads.lease(&self.client.address)
    }
}

impl NodePool {
    /// Connects to every node and refuses a cluster whose vocabularies or tokenizers differ,
    /// naming both sides. `dns:///` addresses stand for every replica their name resolves
    /// to, re-resolved every `discovery.interval`; the pool waits until at least one target
    /// answers, while drafts may come later (sessions decode target-only until then).
    pub async fn connect(
        targets: &[String],
        drafts: &[String],
        dialing: &Dialing,
        discovery: &Discovery,
    ) -> Result<Self, CoordinatorError> {
        if targets.is_empty() {
            return Err(CoordinatorError::NoNode("target"));
        }
        let (target_addresses, draft_addresses) = (NodeAddress::parse_all(targets)?, NodeAddress::parse_all(drafts)?);
        let reference = Arc::new(Reference::default());
        let (targets, target_infos) = Watcher::<TargetClient>::start(
            &target_addresses,
            true,
            Arc::clone(&reference),
            discovery.clone(),
            dialing.clone(),
        )
        .await?;
        let (drafts, draft_infos) = Watcher::<DraftClient>::start(
            &draft_addresses,
            false,
            Arc::clone(&reference),
            discovery.clone(),
            dialing.clone(),
        )
        .await?;
        let (_, first) = &target_infos[0];
        // A session lives on a target and a draft: it may only grow as long as the shorter allows.
        let context_length =
            target_infos.iter().chain(&draft_infos).map(|(_, i)| i.context_length as usize).min().unwrap_or(0);
        reference.fix_context_length(context_length);
        let facts = ModelFacts {
            vocab_size: first.vocab_size as usize,
            context_length,
            eos_token_ids: first.eos_token_ids.clone(),
            tokenizer_fingerprint: first.tokenizer_fingerprint.clone(),
            target_model: first.model_id.clone(),
            draft_model: draft_infos.first().map(|(_, i)| i.model_id.clone()),
            // Loaded by the caller, from this target or a directory (crate::text).
            text: None,
            has_tokenizer: first.has_tokenizer,
            constraints: Err("the target model has no tokenizer".into()),
        };
        Ok(Self {
            targets,
            drafts,
            target_routes: Arc::new(PrefixRoutes::new(DEFAULT_CAPACITY)),
            draft_routes: Arc::new(PrefixRoutes::new(DEFAULT_CAPACITY)),
            target_loads: ReplicaLoads::default(),
            draft_loads: Arc::default(),
            next: AtomicUsize::new(0),
            facts,
        })
    }

    /// The target replicas new sessions may use now.
    pub fn targets(&self) -> Replicas<TargetClient> {
        self.targets.clone()
    }

    /// The draft replicas new sessions may use now.
    pub fn drafts(&self) -> Replicas<DraftClient> {
        self.drafts.clone()
    }

    /// The other target replicas, in the order a session falls back to them.
    pub fn spare_targets(&self, chosen: &TargetClient) -> Vec<TargetClient> {
        let targets = self.targets.current();
        let n = targets.len();
        match targets.iter().position(|t| t.address == chosen.address) {
            Some(at) => (1..n).map(|i| targets[(at + i) % n].clone()).collect(),
            None => targets.to_vec(),
        }
    }

    /// UNAVAILABLE when no target is left; a generation may start otherwise.
    pub fn ready(&self) -> Result<(), CoordinatorError> {
        if self.targets.current().is_empty() { Err(CoordinatorError::NoNode("target")) } else { Ok(()) }
    }

    /// The replicas a new session on `prompt` will use (and keep: they hold its KV caches):
    /// in each role the one holding the prompt's longest prefix seen, within its bounded
    /// share, else the least loaded; no draft for a generation that may not draft
    /// (`drafts` false: γ is 0). The target counts on its replica at once and its route is
    /// recorded as the session opens ([`Picked::target_route`]); the draft's, both when its
    /// session opens ([`DraftChoice::engage`]). UNAVAILABLE when no target is left.
    pub fn pick(&self, prompt: &PromptBlocks, drafts: bool) -> Result<Picked, CoordinatorError> {
        let turn = self.next.fetch_add(1, Ordering::Relaxed);
        let targets = self.targets.current();
        if targets.is_empty() {
            return Err(CoordinatorError::NoNode("target"));
        }
        let target = targets[route(&targets, &self.target_routes, &self.target_loads, prompt, turn)].clone();
        let target_lease = self.target_loads.lease(&target.address);
        let drafts = if drafts { self.drafts.current() } else { Arc::from([]) };
        let draft = (!drafts.is_empty()).then(|| DraftChoice {
            client: drafts[route(&drafts, &self.draft_routes, &self.draft_loads, prompt, turn)].clone(),
            routes: Arc::clone(&self.draft_routes),
            loads: Arc::clone(&self.draft_loads),
            prompt: prompt.clone(),
        });
        let target_route = RouteNote::new(Arc::clone(&self.target_routes), prompt.clone());
        Ok(Picked { target, draft, target_route, target_lease })
    }

    /// A target for a call outside a generation (the next-token law): the least loaded.
    pub fn any_target(&self) -> Result<TargetClient, CoordinatorError> {
        let targets = self.targets.current();
        if targets.is_empty() {
            return Err(CoordinatorError::NoNode("target"));
        }
        let turn = self.next.fetch_add(1, Ordering::Relaxed);
        Ok(targets[route(&targets, &self.target_routes, &self.target_loads, &PromptBlocks::default(), turn)].clone())
    }
}

/// The index among `replicas` (not empty) that a session on `prompt` goes to.
fn route<C: Replica>(
    replicas: &[C],
    routes: &PrefixRoutes,
    loads: &ReplicaLoads,
    prompt: &PromptBlocks,
    turn: usize,
) -> usize {
    let held = routes.lookup(prompt).and_then(|(holder, _)| replicas.iter().position(|r| r.url() == &*holder));
    let counts: Vec<usize> = replicas.iter().map(|r| loads.of(r.url())).collect();
    choose(&counts, held, turn)
}

impl Replica for TargetClient {
    const ROLE: &'static str = "target";

    async fn dial(url: String, dialing: Dialing) -> Result<Self, CoordinatorError> {
        TargetClient::connect(&url, &dialing).await
    }

    async fn node_info(&self) -> Result<NodeInfo, CoordinatorError> {
        self.info().await
    }

    fn url(&self) -> &str {
        &self.address
    }
}

impl Replica for DraftClient {
    const ROLE: &'static str = "draft";

    async fn dial(url: String, dialing: Dialing) -> Result<Self, CoordinatorError> {
        DraftClient::connect(&url, &dialing).await
    }

    async fn node_info(&self) -> Result<NodeInfo, CoordinatorError> {
        self.info().await
    }

    fn url(&self) -> &str {
        &self.address
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_draft_replica_counts_a_generation_and_holds_its_prefix_only_once_engaged() {
        let address = "http://127.0.0.1:9";
        let lazy = Endpoint::from_static(address).connect_lazy();
        let client = NodeClient {
            role: "draft",
            address: address.to_owned(),
            client: DraftServiceClient::new(lazy),
            timeout: Duration::from_secs(1),
            in_process: None,
        };
        let (routes, loads) = (Arc::new(PrefixRoutes::new(16)), Arc::new(ReplicaLoads::default()));
        let prompt = PromptBlocks::of("", &(0..40).collect::<Vec<u32>>());
        let choice = DraftChoice { client, routes: Arc::clone(&routes), loads: Arc::clone(&loads), prompt };
        // Picked, not engaged: a generation that starts without drafting.
        assert_eq!((routes.lookup(&choice.prompt), loads.of(address)), (None, 0));
        let lease = choice.engage();
        assert_eq!(loads.of(address), 1);
        let (holder, blocks) = routes.lookup(&choice.prompt).expect("the prefix is routed to the draft");
        assert_eq!((&*holder, blocks), (address, 2));
        drop(lease);
        assert_eq!(loads.of(address), 0, "released with the draft's sessions");
    }
}
