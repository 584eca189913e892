//! The crate's one error enum.

/// What can go wrong setting up or using the namespaces.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error(
        "network namespaces need root (this process runs with effective uid {0}): the harness creates them and \
         their veth pairs with `ip`"
    )]
    NotRoot(u32),
    #[error("iproute2's `ip` cannot run ({0}); the network-namespace harness needs it")]
    NoIp(String),
    #[error("`ip {args}` failed: {stderr}")]
    Ip { args: String, stderr: String },
    #[error("{role}: {why}")]
    Role { role: String, why: String },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
