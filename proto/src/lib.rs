//! specd-proto: the `specd.v1` protobuf package and its conversions.
//!
//! - [`v1`]: generated messages, clients and servers of `specd/v1/generation.proto` (the
//!   public `Generation` service) and `specd/v1/nodes.proto` (the internal `DraftService` and
//!   `TargetService` of the round protocol, docs/architecture.md);
//! - [`convert`]: conversions between wire messages and `specd-sampling` types, validating
//!   what a peer sent;
//! - [`error`]: [`ProtoError`] and its mapping to gRPC status codes;
//! - [`transport`]: the server every role runs (health, reflection, no Nagle delay, TLS);
//! - [`in_process`]: round streams to nodes served in the coordinator's own process, on
//!   channels instead of gRPC;
//! - [`tls`]: TLS and mutual TLS settings for servers and clients;
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors, for gRPC server reflection.

pub mod convert;
pub mod error;
pub mod in_process;
pub mod tls;
pub mod transport;

pub use error::ProtoError;

/// Generated code of the `specd.v1` package.
#[allow(missing_debug_implementations, unused_qualifications, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("specd.v1");
}

/// Generated code of `specd/bench/echo.proto`, used only by the transport benchmark.
#[doc(hidden)]
#[allow(missing_debug_implementations, unused_qualifications, clippy::all, clippy::pedantic)]
pub mod bench {
    tonic::include_proto!("specd.bench");
}

/// The encoded `FileDescriptorSet` of every specd proto, for tonic-reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/specd_descriptor.bin"));
