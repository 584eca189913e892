//! One generation's spans from three processes (`specd target`, `specd draft`,
//! `specd coordinator`) arrive at an OTLP receiver inside this test as one trace: the
//! client's span → the coordinator's `generation` span → one `round` span per round → the
//! draft's `propose` and the target's `verify` spans, each in its own service.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::generation_client::GenerationClient;
use specd_proto::v1::{GenerateRequest, SamplingParams, Speculation, StoppingCriteria, TokenIds};
use tonic::{Request, Response, Status};

use crate::common::{Running, start};

/// Every span received, with the service name of the process that sent it.
#[derive(Default, Clone)]
struct Receiver {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(Value::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn start_role(args: &[&str], otlp: &str) -> (Running, String) {
    let mut args = args.to_vec();
    args.extend(["--listen", "127.0.0.1:0", "--otlp-endpoint", otlp]);
    let (process, address) = start(&args, &[("OTEL_BSP_SCHEDULE_DELAY", "100")]);
    (process, format!("http://{address}"))
}

fn int_attribute(span: &Span, key: &str) -> Option<i64> {
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
        Value::IntValue(v) => Some(*v),
        _ => None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_generation_is_one_trace_across_three_processes() {
    let _host = crate::alone().await;
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e/traces");
    std::fs::create_dir_all(&dir).unwrap();
    let (target_model, draft_model) = (dir.join("target.json"), dir.join("draft.json"));
    std::fs::write(&target_model, r#"{"vocab_size": 4, "default": [0.4, 0.3, 0.2, 0.1]}"#).unwrap();
    std::fs::write(&draft_model, r#"{"vocab_size": 4, "default": [0.25, 0.25, 0.25, 0.25]}"#).unwrap();
    let (_target, target_url) = start_role(&["target", "--model", target_model.to_str().unwrap()], &otlp);
    let (_draft, draft_url) = start_role(&["draft", "--model", draft_model.to_str().unwrap()], &otlp);
    let (_coordinator, endpoint) =
        start_role(&["coordinator", "--target", &target_url, "--draft", &draft_url, "--gamma", "3"], &otlp);

    let (trace_id, client_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let mut request = Request::new(GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: vec![1, 2] })),
        sampling: Some(SamplingParams { temperature: Some(1.0), seed: Some(5), ..Default::default() }),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(20), ignore_eos: true, ..Default::default() }),
        speculation: Some(Speculation { gamma: Some(3), dense: false }),
        ..Default::default()
    });
    request.metadata_mut().insert("traceparent", format!("00-{trace_id}-{client_span}-01").parse().unwrap());
    let mut client = GenerationClient::connect(endpoint).await.unwrap();
    let reply = client.generate(request).await.unwrap().into_inner();
    let rounds = reply.stats.unwrap().rounds as usize;
    assert!(rounds >= 5, "{rounds} rounds");

    // The exporters batch every 100 ms: wait until all of the generation's spans are in.
    let named = |spans: &[(String, Span)], name: &str| -> Vec<(String, Span)> {
        spans.iter().filter(|(_, s)| s.name == name).cloned().collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let spans = loop {
        let spans = receiver.spans.lock().unwrap().clone();
        let complete = named(&spans, "generation").len() == 1
            && named(&spans, "round").len() == rounds
            && named(&spans, "verify").len() == rounds;
        if complete || Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    for (service, span) in &spans {
        assert_eq!(hex(&span.trace_id), trace_id, "{service} {} is in another trace", span.name);
    }

    let generation = named(&spans, "generation");
    assert_eq!(generation.len(), 1, "one request span");
    let (service, generation) = &generation[0];
    assert_eq!(service, "specd-coordinator");
    assert_eq!(hex(&generation.parent_span_id), client_span, "the client's span is the parent");
    assert_eq!(int_attribute(generation, "specd.rounds"), Some(rounds as i64));
    assert_eq!(int_attribute(generation, "gen_ai.usage.output_tokens"), Some(20));

    let round_spans = named(&spans, "round");
    assert_eq!(round_spans.len(), rounds, "one span per round");
    let mut round_ids = HashMap::new();
    for (service, round) in &round_spans {
        assert_eq!(service, "specd-coordinator");
        assert_eq!(round.parent_span_id, generation.span_id, "rounds are children of the request");
        round_ids.insert(round.span_id.clone(), int_attribute(round, "specd.round.gamma").unwrap());
    }
    let verifies = named(&spans, "verify");
    let parents: HashSet<_> = verifies.iter().map(|(_, s)| s.parent_span_id.clone()).collect();
    assert_eq!(parents.len(), rounds, "one verify span under each round");
    for (service, verify) in &verifies {
        assert_eq!(service, "specd-target");
        assert!(round_ids.contains_key(&verify.parent_span_id), "verify's parent is a round span");
    }
    let proposes = named(&spans, "propose");
    let drafted_rounds = round_ids.values().filter(|gamma| **gamma > 0).count();
    assert_eq!(proposes.len(), drafted_rounds, "one propose span per round with γ > 0");
    for (service, propose) in &proposes {
        assert_eq!(service, "specd-draft");
        assert!(round_ids[&propose.parent_span_id] > 0, "propose's parent is a drafted round");
    }
    for name in ["open_session", "release"] {
        let services: HashSet<_> = named(&spans, name).into_iter().map(|(service, _)| service).collect();
        assert_eq!(services, HashSet::from(["specd-draft".to_owned(), "specd-target".to_owned()]), "{name}");
    }
}
