//! W3C trace context across the roles. Unary calls carry it in gRPC metadata; round
//! messages carry it in their `trace_context` map, because one long-lived stream carries
//! every round of a session and metadata is sent once per stream.
//!
//! Both use the global propagator, which [`crate::init`] sets to W3C TraceContext when traces
//! are exported; otherwise nothing is injected and extraction yields an empty context.

use std::collections::HashMap;

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (MetadataKey::from_bytes(key.as_bytes()), MetadataValue::try_from(value.as_str()))
        {
            self.0.insert(key, value);
        }
    }
}

struct MetadataExtractor<'a>(&'a MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

struct MapInjector<'a>(&'a mut HashMap<String, String>);

impl Injector for MapInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

struct MapExtractor<'a>(&'a HashMap<String, String>);

impl Extractor for MapExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// Puts the current span's context into outgoing gRPC metadata.
pub fn inject_into_metadata(metadata: &mut MetadataMap) {
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&context, &mut MetadataInjector(metadata)));
}

/// The caller's context from incoming gRPC metadata (empty when there is none).
pub fn extract_from_metadata(metadata: &MetadataMap) -> Context {
    opentelemetry::global::get_text_map_propagator(|p| p.extract(&MetadataExtractor(metadata)))
}

/// The context of `span`, for a round message's `trace_context`.
pub fn context_map(span: &tracing::Span) -> HashMap<String, String> {
    let mut map = HashMap::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&span.context(), &mut MapInjector(&mut map)));
    map
}

/// The context a round message carries.
pub fn extract_from_map(map: &HashMap<String, String>) -> Context {
    opentelemetry::global::get_text_map_propagator(|p| p.extract(&MapExtractor(map)))
}

/// Makes `span` a child of the remote `parent`, when there is one.
pub fn set_remote_parent(span: &tracing::Span, parent: Context) {
    use opentelemetry::trace::TraceContextExt as _;
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}
