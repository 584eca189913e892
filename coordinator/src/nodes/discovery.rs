//! Replica discovery. A node address is either a URL, `http://HOST:PORT` or
//! `https://HOST:PORT`: one replica, connected at startup and kept; or `dns:///HOST:PORT`:
//! every address HOST resolves to (all its A and AAAA records: the ready pods behind a
//! Kubernetes headless Service), re-resolved every [`Discovery::interval`].
//!
//! One [`Watcher`] actor per role owns that role's replica set: on each pass it resolves every
//! `dns:///` name, connects to addresses it has not seen, checks them against the cluster
//! (same vocabulary and tokenizer as the first target, at least the cluster's context length)
//! and adds them; addresses that vanished from the answer are dropped. It publishes the set
//! through a `watch` channel; [`Replicas`] is the handle new sessions pick from, and the actor
//! stops when every handle is gone. A session keeps the clients it picked, so a re-resolution
//! never moves a session off the replicas that hold its KV caches; a dropped replica only
//! stops getting new sessions.
//!
//! A name that fails to resolve (a DNS timeout, say) keeps the replicas it had; a name that
//! resolves to nothing drops them all. The resolver is injectable ([`Resolver`]) so that tests
//! can put several loopback servers behind one name ([`StaticResolver`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use specd_proto::in_process::InProcessNodes;
use specd_proto::tls::ClientTls;
use specd_proto::v1::NodeInfo;
use tokio::sync::watch;
use tonic::transport::Uri;

use crate::error::CoordinatorError;

/// How often `dns:///` names are resolved again by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// One entry of `--target` or `--draft`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAddress {
    /// One replica at this URL.
    Url(String),
    /// Every address `host` resolves to, at `port`.
    Dns { host: String, port: u16 },
}

impl NodeAddress {
    /// Parses `http://HOST:PORT`, `https://HOST:PORT` or `dns:///HOST:PORT`, without any
    /// network access.
    pub fn parse(address: &str) -> Result<Self, CoordinatorError> {
        let bad = |why: &str| CoordinatorError::InvalidConfig(format!("node address {address:?}: {why}"));
        if let Some(rest) = address.strip_prefix("dns:") {
            let Some(name) = rest.strip_prefix("///") else {
                return Err(bad(
                    "write dns:///HOST:PORT (a DNS server in the authority, dns://SERVER/…, is not supported)",
                ));
            };
            let (host, port) = name.rsplit_once(':').ok_or_else(|| bad("the port is missing (dns:///HOST:PORT)"))?;
            let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
            if host.is_empty() || host.contains('/') {
                return Err(bad("the host is missing (dns:///HOST:PORT)"));
            }
            let port =
                port.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| bad("the port is not in 1..=65535"))?;
            return Ok(Self::Dns { host: host.to_owned(), port });
        }
        let uri: Uri = address.parse().map_err(|e| bad(&format!("not a URL ({e})")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(bad("expected http://HOST:PORT, https://HOST:PORT or dns:///HOST:PORT"));
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(bad("the host is missing"));
        }
        Ok(Self::Url(address.to_owned()))
    }

    /// Parses every entry; the first bad one is the error.
    pub fn parse_all(addresses: &[String]) -> Result<Vec<Self>, CoordinatorError> {
        addresses.iter().map(|a| Self::parse(a)).collect()
    }
}

impl fmt::Display for NodeAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Url(url) => f.write_str(url),
            Self::Dns { host, port } => write!(f, "dns:///{host}:{port}"),
        }
    }
}

/// What a [`Resolver`] returns.
pub type Resolving<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'a>>;

/// Turns a name into the socket addresses of its replicas.
pub trait Resolver: fmt::Debug + Send + Sync {
    /// Every address `host` stands for now, with `port` (a resolver may give its own ports).
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolving<'a>;
}

/// The system's resolver (`getaddrinfo` through [`tokio::net::lookup_host`]): every A and
/// AAAA record, with the search domains of `/etc/resolv.conf`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolving<'a> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// A table of names, changeable while the coordinator runs: for tests. A name not in it
/// fails to resolve.
#[derive(Debug, Default, Clone)]
pub struct StaticResolver {
    table: Arc<Mutex<HashMap<String, Vec<SocketAddr>>>>,
}

impl StaticResolver {
    /// From now on, `host` resolves to `addresses` (ports included).
    pub fn set(&self, host: &str, addresses: Vec<SocketAddr>) {
        self.table.lock().unwrap_or_else(PoisonError::into_inner).insert(host.to_owned(), addresses);
    }

    /// From now on, `host` fails to resolve (as in a DNS outage).
    pub fn forget(&self, host: &str) {
        self.table.lock().unwrap_or_else(PoisonError::into_inner).remove(host);
    }
}

impl Resolver for StaticResolver {
    fn resolve<'a>(&'a self, host: &'a str, _port: u16) -> Resolving<'a> {
        let found = self.table.lock().unwrap_or_else(PoisonError::into_inner).get(host).cloned();
        Box::pin(async move {
            found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{host} is not in the table")))
        })
    }
}

/// How `dns:///` node addresses are resolved.
#[derive(Debug, Clone)]
pub struct Discovery {
    /// Time between two resolutions of every name.
    pub interval: Duration,
    pub resolver: Arc<dyn Resolver>,
}

impl Default for Discovery {
    fn default() -> Self {
        Self { interval: DEFAULT_INTERVAL, resolver: Arc::new(SystemResolver) }
    }
}

/// How to reach a node: the deadline to connect and of every call, TLS, and the nodes
/// this process serves itself.
#[derive(Debug, Clone)]
pub struct Dialing {
    pub timeout: Duration,
    /// TLS to every node; a discovered replica's names its certificate's host.
    pub tls: ClientTls,
    pub in_process: InProcessNodes,
}

/// A node client the watcher can make and check.
pub trait Replica: Clone + fmt::Debug + Send + Sync + 'static {
    /// `target` or `draft`.
    const ROLE: &'static str;
    /// Connects to `url`.
    fn dial(url: String, dialing: Dialing) -> impl Future<Output = Result<Self, CoordinatorError>> + Send;
    fn node_info(&self) -> impl Future<Output = Result<NodeInfo, CoordinatorError>> + Send;
    fn url(&self) -> &str;
}

/// What every replica must agree with: the first target, and the context length the
/// coordinator validates requests against.
#[derive(Debug, Default)]
pub struct Reference {
    first_target: OnceLock<(String, NodeInfo)>,
    /// 0 until the cluster's context length is fixed at startup.
    min_context: AtomicU64,
}

impl Reference {
    /// Checks `info` of the `role` node at `url`; the first target checked becomes the
    /// reference of everything after it.
    pub fn check(&self, role: &str, url: &str, info: &NodeInfo) -> Result<(), CoordinatorError> {
        let (first_url, first) = self.first_target.get_or_init(|| (url.to_owned(), info.clone()));
        if !(role == "target" && first_url == url) {
            crate::nodes::vocab::check_vocabulary(first_url, first, role, url, info)?;
        }
        let min = self.min_context.load(Ordering::Relaxed);
        if min > 0 && u64::from(info.context_length) < min {
            return Err(CoordinatorError::Incompatible(format!(
                "the {role} at {url} ({}) has a context length of {}, below the cluster's {min}",
                info.model_id, info.context_length
            )));
        }
        Ok(())
    }

    /// From now on, replicas with a shorter context are refused.
    pub fn fix_context_length(&self, length: usize) {
        self.min_context.store(length as u64, Ordering::Relaxed);
    }
}

/// The replicas of one role that new sessions may use: a handle on its [`Watcher`].
#[derive(Debug, Clone)]
pub struct Replicas<C> {
    current: watch::Receiver<Arc<[C]>>,
}

impl<C> Replicas<C> {
    /// The replicas as of the last resolution (static ones first, then discovered ones by
    /// address).
    pub fn current(&self) -> Arc<[C]> {
        Arc::clone(&self.current.borrow())
    }

    /// Waits until the set changes; false once the watcher has stopped.
    pub async fn changed(&mut self) -> bool {
        self.current.changed().await.is_ok()
    }
}

/// What one `dns:///` entry resolved to last.
#[derive(Debug)]
struct Name {
    host: String,
    port: u16,
}

/// Owns one role's replica set and keeps it current.
#[derive(Debug)]
pub struct Watcher<C> {
    fixed: Vec<C>,
    names: Vec<Name>,
    /// Discovered replicas by URL, with the index of the name they came from.
    found: BTreeMap<String, (usize, C)>,
    reference: Arc<Reference>,
    discovery: Discovery,
    dialing: Dialing,
    tx: watch::Sender<Arc<[C]>>,
}

/// The replicas found at startup, with what they said about themselves.
pub type Initial = Vec<(String, NodeInfo)>;

impl<C: Replica> Watcher<C> {
    /// Connects to every URL (any failure is the error, as is an incompatible node), resolves
    /// every name once and connects to what it finds (an unreachable address is skipped and
    /// tried again on the next pass). With `wait_for_one`, resolves again every interval
    /// until at least one replica answers. Then keeps the set current in the background, if
    /// there is a name to watch.
    pub async fn start(
        addresses: &[NodeAddress],
        wait_for_one: bool,
        reference: Arc<Reference>,
        discovery: Discovery,
        dialing: Dialing,
    ) -> Result<(Replicas<C>, Initial), CoordinatorError> {
        let mut fixed = Vec::new();
        let mut names = Vec::new();
        let mut initial = Vec::new();
        for address in addresses {
            match address {
                NodeAddress::Url(url) => {
                    let client = C::dial(url.clone(), dialing.clone()).await?;
                    let info = client.node_info().await?;
                    reference.check(C::ROLE, url, &info)?;
                    initial.push((url.clone(), info));
                    fixed.push(client);
                }
                NodeAddress::Dns { host, port } => names.push(Name { host: host.clone(), port: *port }),
            }
        }
        let (tx, rx) = watch::channel(Arc::from(fixed.clone()));
        let mut watcher = Self { fixed, names, found: BTreeMap::new(), reference, discovery, dialing, tx };
        loop {
            initial.extend(watcher.refresh(true).await?);
            if !wait_for_one || !watcher.tx.borrow().is_empty() {
                break;
            }
            tracing::warn!(
                role = C::ROLE,
                names = %watcher.names(),
                retry_in_s = watcher.discovery.interval.as_secs_f64(),
                "no replica found yet: waiting"
            );
            tokio::time::sleep(watcher.discovery.interval).await;
        }
        if !watcher.names.is_empty() {
            tokio::spawn(watcher.run());
        }
        Ok((Replicas { current: rx }, initial))
    }

    fn names(&self) -> String {
        self.names.iter().map(|n| format!("dns:///{}:{}", n.host, n.port)).collect::<Vec<_>>().join(",")
    }

    /// Resolves again every interval until every handle is gone.
    async fn run(mut self) {
        loop {
            tokio::select! {
                () = self.tx.closed() => return,
                () = tokio::time::sleep(self.discovery.interval) => {}
            }
            if let Err(err) = self.refresh(false).await {
                // Only an incompatible node at startup is an error; later ones are skipped.
                tracing::error!(role = C::ROLE, %err, "replica discovery");
            }
        }
    }

    /// The URL of a resolved address, and the TLS settings that check its certificate
    /// against the name it was found under.
    fn endpoint(&self, host: &str, address: SocketAddr) -> (String, ClientTls) {
        let own = &self.dialing.tls;
        let scheme = if own.ca.is_some() { "https" } else { "http" };
        let tls = ClientTls { domain: own.domain.clone().or_else(|| Some(host.to_owned())), ..own.clone() };
        (format!("{scheme}://{address}"), tls)
    }

    /// One pass over every name: adds what is new, drops what vanished, publishes the set
    /// when it changed. Returns what the new replicas said about themselves. At startup an
    /// incompatible replica is an error; later it is skipped (and logged).
    async fn refresh(&mut self, startup: bool) -> Result<Initial, CoordinatorError> {
        let mut wanted: BTreeMap<String, (usize, ClientTls)> = BTreeMap::new();
        let mut failed = Vec::new();
        for (index, name) in self.names.iter().enumerate() {
            match self.discovery.resolver.resolve(&name.host, name.port).await {
                Ok(addresses) => {
                    if addresses.is_empty() {
                        tracing::warn!(role = C::ROLE, host = %name.host, "resolves to no address");
                    }
                    for address in addresses {
                        let (url, tls) = self.endpoint(&name.host, address);
                        wanted.entry(url).or_insert((index, tls));
                    }
                }
                Err(err) => {
                    // Keep what this name had: a failed lookup says nothing about the replicas.
                    tracing::warn!(role = C::ROLE, host = %name.host, %err, "cannot resolve: keeping its replicas");
                    failed.push(index);
                }
            }
        }
        let before = self.found.len();
        self.found.retain(|url, (index, _)| {
            let keep = wanted.contains_key(url) || failed.contains(index);
            if !keep {
                tracing::info!(role = C::ROLE, %url, "replica gone: no new sessions go there");
            }
            keep
        });
        let mut changed = self.found.len() != before;
        let mut new = Vec::new();
        for (url, (index, tls)) in wanted {
            if self.found.contains_key(&url) || self.fixed.iter().any(|c| c.url() == url) {
                continue;
            }
            let joined = async {
                let client = C::dial(url.clone(), Dialing { tls, ..self.dialing.clone() }).await?;
                let info = client.node_info().await?;
                Ok::<_, CoordinatorError>((client, info))
            };
            let (client, info) = match joined.await {
                Ok(joined) => joined,
                Err(err) => {
                    tracing::warn!(role = C::ROLE, %url, %err, "found but not answering: trying again next pass");
                    continue;
                }
            };
            match self.reference.check(C::ROLE, &url, &info) {
                Ok(()) => {}
                Err(err) if startup => return Err(err),
                Err(err) => {
                    tracing::error!(role = C::ROLE, %url, %err, "replica refused");
                    continue;
                }
            }
            tracing::info!(role = C::ROLE, %url, model = %info.model_id, "replica found: new sessions may go there");
            self.found.insert(url.clone(), (index, client));
            new.push((url, info));
            changed = true;
        }
        if changed {
            let set: Vec<C> = self.fixed.iter().cloned().chain(self.found.values().map(|(_, c)| c.clone())).collect();
            self.tx.send_replace(Arc::from(set));
        }
        Ok(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_addresses_parse_or_say_why_not() {
        let dns = |host: &str, port| NodeAddress::Dns { host: host.to_owned(), port };
        assert_eq!(NodeAddress::parse("dns:///specd-target:50052").unwrap(), dns("specd-target", 50052));
        assert_eq!(
            NodeAddress::parse("dns:///specd-target.ns.svc.cluster.local:1").unwrap(),
            dns("specd-target.ns.svc.cluster.local", 1)
        );
        assert_eq!(NodeAddress::parse("dns:///[::1]:7").unwrap(), dns("::1", 7));
        assert_eq!(
            NodeAddress::parse("http://10.0.0.1:50052").unwrap(),
            NodeAddress::Url("http://10.0.0.1:50052".into())
        );
        assert_eq!(NodeAddress::parse("https://t:1").unwrap(), NodeAddress::Url("https://t:1".into()));
        for (bad, why) in [
            ("dns://8.8.8.8/t:1", "not supported"),
            ("dns:///t", "port is missing"),
            ("dns:///t:0", "1..=65535"),
            ("dns:///t:x", "1..=65535"),
            ("dns:///:5", "host is missing"),
            ("t:50052", "expected http://"),
            ("grpc://t:1", "expected http://"),
            ("http://", "not a URL"),
        ] {
            let err = NodeAddress::parse(bad).unwrap_err();
            assert!(matches!(err, CoordinatorError::InvalidConfig(_)), "{bad}: {err:?}");
            assert!(err.to_string().contains(why), "{bad}: {err}");
            assert!(err.to_string().contains(bad), "{bad}: {err}");
        }
        assert_eq!(NodeAddress::parse("dns:///a.b:9").unwrap().to_string(), "dns:///a.b:9");
    }
}
