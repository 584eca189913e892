//! Replica discovery and balancing (issue #8): two target and two draft nodes on loopback
//! behind `dns:///` names that resolve to several addresses. New sessions land on every
//! replica and complete; a replica that appears gets new sessions, one that vanishes gets no
//! new ones while the session already on it finishes there; a name that fails to resolve keeps
//! its replicas, one that resolves to nothing leaves the coordinator UNAVAILABLE. One test
//! goes through the system resolver with `localhost`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use specd_coordinator::{CoordinatorConfig, Discovery, GammaChoice, RuleVariant, StaticResolver, SystemResolver};
use specd_draft_node::DraftNode;
use specd_e2e::{Table, scratch_dir};
use specd_model::{DType, DeviceSpec};
use specd_node::NodeConfig;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::generation_client::GenerationClient;
use specd_proto::v1::{
    FinishReason, GenerateRequest, GenerateResponse, SamplingParams, Speculation, StoppingCriteria, TokenIds,
};
use specd_sampling::Truncation;
use specd_target_node::TargetNode;
use specd_telemetry::Metrics;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::Code;
use tonic::Streaming;
use tonic::transport::Channel;

const VOCAB: usize = 6;
/// Each forward pass takes this long, so that generations are still running when the test
/// counts the sessions each node holds.
const FORWARD_DELAY: Duration = Duration::from_millis(25);
const INTERVAL: Duration = Duration::from_millis(100);

fn model(name: &str) -> PathBuf {
    let dir = scratch_dir(name);
    let table = Table { vocab_size: VOCAB, default: vec![1.0 / VOCAB as f64; VOCAB], rules: Vec::new() };
    table.write(&dir.join("model.json")).unwrap()
}

/// A node server with its own metrics registry (its open sessions); stops when dropped.
struct Node {
    address: SocketAddr,
    role: &'static str,
    metrics: Metrics,
    _stop: watch::Sender<bool>,
}

impl Node {
    async fn start(role: &'static str, model: &Path, listener: TcpListener) -> Self {
        let metrics = Metrics::new();
        let config = NodeConfig {
            model: model.to_owned(),
            device: DeviceSpec::Cpu,
            dtype: DType::F32,
            engine: Default::default(),
            attention: Default::default(),
            max_sessions: 64,
            prefix_cache: Default::default(),
            kv_budget: specd_model::KvBudget::Unbounded,
            forward_delay: FORWARD_DELAY,
            session_ttl: None,
            tls: Default::default(),
            metrics: Some(metrics.clone()),
            threads: None,
            sampling_threads: None,
            pin_threads: false,
            allow_unused_weights: false,
            distributions: Default::default(),
            faults: Default::default(),
            batch: Default::default(),
        };
        let address = listener.local_addr().unwrap();
        let (stop, mut rx) = watch::channel(false);
        let stopped = async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        if role == "target" {
            let node = TargetNode::load(config).await.unwrap();
            tokio::spawn(specd_target_node::serve(listener, node, stopped));
        } else {
            let node = DraftNode::load(config).await.unwrap();
            tokio::spawn(specd_draft_node::serve(listener, node, stopped));
        }
        Self { address, role, metrics, _stop: stop }
    }

    async fn on_loopback(role: &'static str, model: &Path) -> Self {
        Self::start(role, model, TcpListener::bind("127.0.0.1:0").await.unwrap()).await
    }

    /// Sessions open on the node now.
    async fn sessions(&self) -> u64 {
        self.counter("specd_active_sessions").await
    }

    /// The value of the node's series `name` (labelled with its role).
    async fn counter(&self, name: &str) -> u64 {
        let text = self.metrics.encode().await.unwrap();
        let key = format!("{name}{{role=\"{}\"}} ", self.role);
        let line = text.lines().find(|l| l.starts_with(&key)).unwrap_or_else(|| panic!("no {key:?} in {text}"));
        line[key.len()..].trim().parse().unwrap()
    }
}

/// A coordinator over `targets` and `drafts` (node addresses) on a loopback port.
async fn coordinator(
    targets: &str,
    drafts: &str,
    discovery: Discovery,
) -> (GenerationClient<Channel>, watch::Sender<bool>) {
    let config = CoordinatorConfig {
        targets: vec![targets.to_owned()],
        drafts: vec![drafts.to_owned()],
        discovery,
        default_gamma: GammaChoice::Fixed(2),
        default_max_new_tokens: 16,
        truncation: Truncation::new(0.0, 8).unwrap(),
        node_timeout: Duration::from_secs(10),
        rule: RuleVariant::Exact,
        verification: specd_sampling::Verification::default(),
        optimistic: true,
        tree: Default::default(),
        metrics: None,
        tls: Default::default(),
        admission: Default::default(),
        tokenizer: None,
        generation_config: true,
        in_process: Default::default(),
    };
    let service = specd_coordinator::connect(&config).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (stop, mut rx) = watch::channel(false);
    tokio::spawn(specd_coordinator::serve(listener, service, async move {
        let _ = rx.wait_for(|s| *s).await;
    }));
    (GenerationClient::connect(endpoint).await.unwrap(), stop)
}

fn request(max_new_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: vec![1, 2] })),
        sampling: Some(SamplingParams { temperature: Some(1.0), ..Default::default() }),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(max_new_tokens), ..Default::default() }),
        speculation: Some(Speculation { gamma: Some(2), dense: false }),
        ..Default::default()
    }
}

/// A streamed generation that has run its first round, and the tokens it sent so far.
type Started = (Streaming<GenerateResponse>, usize);

/// Starts a streamed generation and waits for its first round: both nodes' sessions are open.
async fn started(client: &mut GenerationClient<Channel>, max_new_tokens: u32) -> Started {
    let mut stream = client.generate_stream(request(max_new_tokens)).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().expect("a first round");
    assert!(!first.token_ids.is_empty());
    (stream, first.token_ids.len())
}

/// Reads a generation to its end: all its tokens, and the last message.
async fn finish((mut stream, mut tokens): Started) -> (usize, GenerateResponse) {
    let mut last = GenerateResponse::default();
    while let Some(message) = stream.message().await.unwrap() {
        tokens += message.token_ids.len();
        last = message;
    }
    (tokens, last)
}

async fn sessions(nodes: &[&Node]) -> Vec<u64> {
    let mut counts = Vec::new();
    for node in nodes {
        counts.push(node.sessions().await);
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_sessions_are_balanced_over_every_replica_behind_a_name() {
    let model = model("discovery-balance");
    let (t1, t2) = (Node::on_loopback("target", &model).await, Node::on_loopback("target", &model).await);
    let (d1, d2) = (Node::on_loopback("draft", &model).await, Node::on_loopback("draft", &model).await);
    let resolver = StaticResolver::default();
    resolver.set("specd-target.test", vec![t1.address, t2.address]);
    resolver.set("specd-draft.test", vec![d1.address, d2.address]);
    let discovery = Discovery { interval: INTERVAL, resolver: Arc::new(resolver) };
    let (mut client, _stop) =
        coordinator("dns:///specd-target.test:50052", "dns:///specd-draft.test:50053", discovery).await;
    let mut streams = Vec::new();
    for _ in 0..4 {
        streams.push(started(&mut client, 48).await);
    }
    // Round-robin: two sessions on each target and on each draft while all four run.
    assert_eq!(sessions(&[&t1, &t2, &d1, &d2]).await, vec![2, 2, 2, 2]);
    for stream in streams {
        let (tokens, last) = finish(stream).await;
        assert_eq!(tokens, 48);
        assert_eq!(last.finish_reason, FinishReason::Length as i32);
        let stats = last.stats.unwrap();
        assert!(stats.draft_tokens > 0, "the draft proposed: {stats:?}");
        assert_eq!((stats.draft_fallbacks, stats.target_failovers), (0, 0));
    }
    assert_eq!(sessions(&[&t1, &t2, &d1, &d2]).await, vec![0, 0, 0, 0], "every session released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_come_and_go_while_running_sessions_stay_where_their_cache_is() {
    let model = model("discovery-change");
    let (t1, t2) = (Node::on_loopback("target", &model).await, Node::on_loopback("target", &model).await);
    let (d1, d2) = (Node::on_loopback("draft", &model).await, Node::on_loopback("draft", &model).await);
    let resolver = StaticResolver::default();
    resolver.set("specd-target.test", vec![t1.address]);
    resolver.set("specd-draft.test", vec![d1.address]);
    let discovery = Discovery { interval: INTERVAL, resolver: Arc::new(resolver.clone()) };
    let (mut client, _stop) =
        coordinator("dns:///specd-target.test:50052", "dns:///specd-draft.test:50053", discovery).await;
    let early = started(&mut client, 96).await;
    assert_eq!(sessions(&[&t1, &t2, &d1, &d2]).await, vec![1, 0, 1, 0]);

    // The first replicas vanish from the name (a rollout), the second ones appear.
    resolver.set("specd-target.test", vec![t2.address]);
    resolver.set("specd-draft.test", vec![d2.address]);
    tokio::time::sleep(INTERVAL * 5).await;
    let (a, b) = (started(&mut client, 24).await, started(&mut client, 24).await);
    // New sessions only on the new replicas; the early one still on the first ones.
    assert_eq!(sessions(&[&t1, &t2, &d1, &d2]).await, vec![1, 2, 1, 2]);
    for stream in [a, b] {
        assert_eq!(finish(stream).await.0, 24);
    }
    let (tokens, last) = finish(early).await;
    assert_eq!(tokens, 96, "the early session finished where it started");
    let stats = last.stats.unwrap();
    assert_eq!((stats.draft_fallbacks, stats.target_failovers), (0, 0), "{stats:?}");

    // A name that resolves to nothing leaves no target: UNAVAILABLE, naming the role.
    resolver.set("specd-target.test", Vec::new());
    tokio::time::sleep(INTERVAL * 5).await;
    let status = client.generate(request(8)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("no target node is available"), "{status:?}");

    // And the coordinator recovers when a replica is back.
    resolver.set("specd-target.test", vec![t1.address]);
    tokio::time::sleep(INTERVAL * 5).await;
    assert_eq!(finish(started(&mut client, 8).await).await.0, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_fails_to_resolve_keeps_its_replicas() {
    let model = model("discovery-outage");
    let t1 = Node::on_loopback("target", &model).await;
    let d1 = Node::on_loopback("draft", &model).await;
    let resolver = StaticResolver::default();
    resolver.set("specd-target.test", vec![t1.address]);
    resolver.set("specd-draft.test", vec![d1.address]);
    let discovery = Discovery { interval: INTERVAL, resolver: Arc::new(resolver.clone()) };
    let (mut client, _stop) =
        coordinator("dns:///specd-target.test:50052", "dns:///specd-draft.test:50053", discovery).await;
    // Names missing from the table fail to resolve, as in a DNS outage.
    resolver.forget("specd-target.test");
    resolver.forget("specd-draft.test");
    tokio::time::sleep(INTERVAL * 5).await;
    let (tokens, last) = finish(started(&mut client, 16).await).await;
    assert_eq!(tokens, 16);
    assert!(last.stats.unwrap().draft_tokens > 0, "the draft was kept too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localhost_through_the_system_resolver() {
    let model = model("discovery-localhost");
    // A target and a draft on every loopback address `localhost` resolves to (127.0.0.1,
    // and ::1 where the hosts file lists it), each role on one port shared by its replicas.
    let mut targets = Vec::new();
    let mut drafts = Vec::new();
    for (role, nodes) in [("target", &mut targets), ("draft", &mut drafts)] {
        let first = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = first.local_addr().unwrap().port();
        let resolved: Vec<SocketAddr> = tokio::net::lookup_host(("localhost", port)).await.unwrap().collect();
        eprintln!("localhost:{port} resolves to {resolved:?}");
        assert!(resolved.contains(&first.local_addr().unwrap()), "localhost is not 127.0.0.1 here: {resolved:?}");
        let first_address = first.local_addr().unwrap();
        nodes.push(Node::start(role, &model, first).await);
        for other in resolved.iter().filter(|&&a| a != first_address) {
            match TcpListener::bind(other).await {
                Ok(listener) => nodes.push(Node::start(role, &model, listener).await),
                Err(err) => eprintln!("cannot listen on {other} ({err}): one replica fewer"),
            }
        }
    }
    let targets_name = format!("dns:///localhost:{}", targets[0].address.port());
    let drafts_name = format!("dns:///localhost:{}", drafts[0].address.port());
    let discovery = Discovery { interval: INTERVAL, resolver: Arc::new(SystemResolver) };
    let (mut client, _stop) = coordinator(&targets_name, &drafts_name, discovery).await;
    let n = 2 * targets.len().max(drafts.len());
    let mut streams = Vec::new();
    for _ in 0..n {
        streams.push(started(&mut client, 32).await);
    }
    for node in targets.iter().chain(&drafts) {
        assert!(node.sessions().await > 0, "no session on the {} at {}", node.role, node.address);
    }
    for stream in streams {
        let (tokens, last) = finish(stream).await;
        assert_eq!(tokens, 32);
        assert!(last.stats.unwrap().draft_tokens > 0);
    }
}

/// A TCP forwarder to a node that can be cut: every connection through it closes at once and
/// nothing more is accepted, as when the node's process dies.
struct Cuttable {
    address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Cuttable {
    async fn to(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            // Dropped with this task when it is aborted, which aborts every connection.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                connections.spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Self { address, task }
    }

    fn cut(&self) {
        self.task.abort();
    }
}

/// A conversation's turns: a prompt of its own, each turn extended by the reply and two user
/// tokens.
struct Conversation {
    prompt: Vec<u32>,
    /// The target replica (index) its last turn ran on, read from the nodes' cache hits.
    on: Option<usize>,
}

impl Conversation {
    fn new(seed: u32) -> Self {
        let mut state = seed.wrapping_mul(2_654_435_761) | 1;
        let prompt = (0..40)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                state % VOCAB as u32
            })
            .collect();
        Self { prompt, on: None }
    }

    fn request(&self) -> GenerateRequest {
        GenerateRequest { prompt: Some(Prompt::TokenIds(TokenIds { ids: self.prompt.clone() })), ..request(8) }
    }
}

/// Prefix cache hits on each node.
async fn hits(nodes: &[&Node]) -> Vec<u64> {
    let mut counts = Vec::new();
    for node in nodes {
        counts.push(node.counter("specd_prefix_cache_hits_total").await);
    }
    counts
}

/// Routing by prefix (issue #39): three conversations of several turns over two target and two
/// draft replicas, one turn at a time. Every turn after a conversation's first opens where the
/// conversation so far is cached: both nodes report at least its previous prompt as reused,
/// and both targets serve conversations. Then the target holding the first conversation
/// dies (its connections cut; its name still lists it, as a crashed pod's does until its
/// endpoint goes): that
/// conversation's next turn opens on the other target, and the turn after finds its prefix
/// there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_stick_to_the_replicas_holding_their_prefix_and_move_when_one_dies() {
    let model = model("discovery-prefix-routes");
    let mut targets = vec![Node::on_loopback("target", &model).await, Node::on_loopback("target", &model).await];
    let links = [Cuttable::to(targets[0].address).await, Cuttable::to(targets[1].address).await];
    let (d1, d2) = (Node::on_loopback("draft", &model).await, Node::on_loopback("draft", &model).await);
    let resolver = StaticResolver::default();
    resolver.set("specd-target.test", vec![links[0].address, links[1].address]);
    resolver.set("specd-draft.test", vec![d1.address, d2.address]);
    let discovery = Discovery { interval: INTERVAL, resolver: Arc::new(resolver) };
    let (mut client, _stop) =
        coordinator("dns:///specd-target.test:50052", "dns:///specd-draft.test:50053", discovery).await;
    // Three, so that taking replicas in turn would move each conversation every round.
    let mut conversations: Vec<Conversation> = (1..=3).map(Conversation::new).collect();

    // One turn of conversation `c`: the replies' stats, and the target it ran on.
    async fn turn(
        client: &mut GenerationClient<Channel>,
        conversation: &mut Conversation,
        targets: &[&Node],
    ) -> specd_proto::v1::SpeculationStats {
        let before = hits(targets).await;
        let reply = client.generate(conversation.request()).await.unwrap().into_inner();
        assert_eq!(reply.token_ids.len(), 8);
        let after = hits(targets).await;
        conversation.on = (0..targets.len()).find(|&i| after[i] > before[i]);
        conversation.prompt.extend(&reply.token_ids);
        conversation.prompt.extend([1, 2]);
        reply.stats.unwrap()
    }

    for round in 0..3 {
        for conversation in &mut conversations {
            let previous = conversation.prompt.len();
            let stats = turn(&mut client, conversation, &[&targets[0], &targets[1]]).await;
            if round == 0 {
                assert_eq!((stats.target_cached_tokens, stats.draft_cached_tokens), (0, 0), "{stats:?}");
            } else {
                // At least the previous turn's prompt (its reply is eight tokens, the user's two).
                let held = previous - 10;
                assert!(
                    stats.target_cached_tokens as usize >= held,
                    "target reused {} of {held}",
                    stats.target_cached_tokens
                );
                assert!(
                    stats.draft_cached_tokens as usize >= held,
                    "draft reused {} of {held}",
                    stats.draft_cached_tokens
                );
                assert!(conversation.on.is_some());
            }
        }
    }
    let on: Vec<usize> = conversations.iter().map(|c| c.on.unwrap()).collect();
    assert!(on.contains(&0) && on.contains(&1), "every conversation on one target: {on:?}");

    // The first conversation's target dies; its name still lists it.
    let gone = on[0];
    links[gone].cut();
    targets.remove(gone);
    let survivor = &targets[0];
    let moved = turn(&mut client, &mut conversations[0], &[survivor]).await;
    assert_eq!(moved.target_cached_tokens, 0, "a new target has nothing of it: {moved:?}");
    assert!(moved.draft_cached_tokens > 0, "its draft still holds it: {moved:?}");
    let previous = conversations[0].prompt.len();
    let after = turn(&mut client, &mut conversations[0], &[survivor]).await;
    assert!(after.target_cached_tokens as usize >= previous - 10, "the turn after the move: {after:?}");
    // A conversation that was on the survivor is still served from its cache.
    let stayed = on.iter().position(|&t| t != gone).unwrap();
    let previous = conversations[stayed].prompt.len();
    let stats = turn(&mut client, &mut conversations[stayed], &[survivor]).await;
    assert!(stats.target_cached_tokens as usize >= previous - 10, "{stats:?}");
}
