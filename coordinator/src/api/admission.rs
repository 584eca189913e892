//! Who and what the coordinator admits: a bearer token when one is configured, at most so
//! many generations at once (RESOURCE_EXHAUSTED beyond, rather than everyone slowing down),
//! and the client's deadline (`grpc-timeout`), which the session then honours for streams
//! too.

use std::time::{Duration, Instant};

use tonic::Status;
use tonic::metadata::MetadataMap;

/// The coordinator's admission rules.
#[derive(Debug, Clone, Default)]
pub struct Admission {
    /// Clients must send `authorization: Bearer <token>`; `None`: anyone may call.
    pub api_token: Option<String>,
    /// Generations in flight at once; `None`: unbounded.
    pub max_generations: Option<usize>,
}

/// Equal-time comparison: how long it takes does not tell how much of a guess was right.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Admission {
    /// UNAUTHENTICATED unless the request carries the configured bearer token.
    pub fn authorize(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let Some(token) = &self.api_token else { return Ok(()) };
        let sent = metadata.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        match sent {
            Some(sent) if same(sent.as_bytes(), token.as_bytes()) => Ok(()),
            Some(_) => Err(Status::unauthenticated("the bearer token is not the coordinator's")),
            None => Err(Status::unauthenticated("this coordinator needs `authorization: Bearer <token>`")),
        }
    }

    /// RESOURCE_EXHAUSTED when `active` generations already use the whole limit.
    pub fn admit(&self, active: usize) -> Result<(), Status> {
        match self.max_generations {
            Some(limit) if active >= limit => Err(Status::resource_exhausted(format!(
                "{active} generations are in flight, this coordinator's limit; retry later or elsewhere"
            ))),
            _ => Ok(()),
        }
    }
}

/// The client's deadline from `grpc-timeout` (gRPC over HTTP/2: up to 8 digits and a unit
/// H, M, S, m, u or n); `None` when it sent none or an unreadable one.
pub fn deadline(metadata: &MetadataMap, now: Instant) -> Option<Instant> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let timeout = match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    now.checked_add(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(key: &'static str, value: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert(key, value.parse().unwrap());
        m
    }

    #[test]
    fn bearer_tokens() {
        let open = Admission::default();
        assert!(open.authorize(&MetadataMap::new()).is_ok());
        let closed = Admission { api_token: Some("s3cret".into()), ..Admission::default() };
        assert_eq!(closed.authorize(&MetadataMap::new()).unwrap_err().code(), tonic::Code::Unauthenticated);
        assert!(closed.authorize(&with("authorization", "Bearer s3cret")).is_ok());
        assert!(closed.authorize(&with("authorization", "Bearer s3cre")).is_err());
        assert!(closed.authorize(&with("authorization", "s3cret")).is_err());
    }

    #[test]
    fn limits() {
        let limited = Admission { max_generations: Some(2), ..Admission::default() };
        assert!(limited.admit(1).is_ok());
        let err = limited.admit(2).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("2 generations"));
        assert!(Admission::default().admit(usize::MAX - 1).is_ok());
    }

    #[test]
    fn grpc_timeouts() {
        let now = Instant::now();
        assert_eq!(deadline(&with("grpc-timeout", "250m"), now), Some(now + Duration::from_millis(250)));
        assert_eq!(deadline(&with("grpc-timeout", "3S"), now), Some(now + Duration::from_secs(3)));
        assert_eq!(deadline(&with("grpc-timeout", "2H"), now), Some(now + Duration::from_secs(7200)));
        assert_eq!(deadline(&with("grpc-timeout", "123456789S"), now), None, "more than 8 digits");
        assert_eq!(deadline(&with("grpc-timeout", "5x"), now), None);
        assert_eq!(deadline(&with("grpc-timeout", "S"), now), None);
        assert_eq!(deadline(&MetadataMap::new(), now), None);
    }
}
