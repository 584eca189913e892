//! TLS and mutual TLS for every gRPC hop (rustls through tonic). A server with a
//! certificate and key speaks TLS; with a client CA as well it also requires every client to
//! present a certificate that CA signed (mutual TLS), and refuses the handshake otherwise. A
//! client verifies its server against a CA and, for mutual TLS, presents its own certificate.

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// Why a TLS setting cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {source}")]
    Read { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Incomplete(String),
}

/// A role's own TLS identity and whom it accepts as clients.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerTls {
    /// PEM certificate chain and private key; TLS is off without them.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// PEM CA: clients must present a certificate it signed (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// How a client reaches a TLS server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM CA that signed the servers' certificates; TLS is off without it.
    pub ca: Option<PathBuf>,
    /// The client's own PEM certificate and key, for servers that require mutual TLS.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name the server's certificate must carry (default: the host of its URL).
    pub domain: Option<String>,
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { what, path: path.to_owned(), source })
}

fn identity(cert: Option<&Path>, key: Option<&Path>, flags: &str) -> Result<Option<Identity>, TlsError> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(Identity::from_pem(read("certificate", cert)?, read("private key", key)?))),
        (None, None) => Ok(None),
        _ => Err(TlsError::Incomplete(format!("{flags}: give both the certificate and the key, or neither"))),
    }
}

impl ServerTls {
    /// The server's TLS configuration; `None` when TLS is off.
    pub fn config(&self) -> Result<Option<ServerTlsConfig>, TlsError> {
        let Some(identity) = identity(self.cert.as_deref(), self.key.as_deref(), "--tls-cert/--tls-key")? else {
            if self.client_ca.is_some() {
                return Err(TlsError::Incomplete(
                    "--tls-client-ca needs --tls-cert and --tls-key: mutual TLS is TLS first".into(),
                ));
            }
            return Ok(None);
        };
        let mut config = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.client_ca {
            config = config.client_ca_root(Certificate::from_pem(read("client CA", ca)?));
        }
        Ok(Some(config))
    }
}

impl ClientTls {
    /// The client's TLS configuration for a server at `host`; `None` when TLS is off.
    pub fn config(&self, host: &str) -> Result<Option<ClientTlsConfig>, TlsError> {
        let identity = identity(self.cert.as_deref(), self.key.as_deref(), "--node-tls-cert/--node-tls-key")?;
        let Some(ca) = &self.ca else {
            if identity.is_some() {
                return Err(TlsError::Incomplete("a client certificate needs the CA of the servers as well".into()));
            }
            return Ok(None);
        };
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read("CA", ca)?))
            .domain_name(self.domain.clone().unwrap_or_else(|| host.to_owned()));
        if let Some(identity) = identity {
            config = config.identity(identity);
        }
        Ok(Some(config))
    }
}
