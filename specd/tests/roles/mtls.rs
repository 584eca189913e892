//! Mutual TLS between the coordinator and the nodes: with `--tls-client-ca`, a node lets in
//! only clients whose certificate that CA signed; and `specd up`'s gRPC API over TLS. The
//! certificates are made in the test.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::generation_client::GenerationClient;
use specd_proto::v1::target_service_client::TargetServiceClient;
use specd_proto::v1::{FinishReason, GenerateRequest, InfoRequest, StoppingCriteria, TokenIds};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::common::start;

struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        Self(CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap())
    }

    /// Writes `name.pem` and `name.key` for a leaf this CA signs.
    fn leaf(&self, dir: &Path, name: &str, purpose: ExtendedKeyUsagePurpose) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![purpose];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.0).unwrap();
        let (cert_path, key_path) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.0.pem()).unwrap();
        path.to_owned()
    }
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Asks the target node for its Info over TLS, as a client with `identity` (or none).
async fn info(url: &str, ca: &Path, identity: Option<(&Path, &Path)>) -> Result<(), String> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(std::fs::read(cert).unwrap(), std::fs::read(key).unwrap()));
    }
    let endpoint = Endpoint::from_shared(url.to_owned()).unwrap().tls_config(tls).map_err(|e| e.to_string())?;
    let channel = endpoint.connect().await.map_err(|e| format!("connect: {e}"))?;
    TargetServiceClient::new(channel).info(InfoRequest {}).await.map(drop).map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_mutual_tls_let_in_only_certificates_of_their_ca() {
    let _host = crate::alone().await;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e/mtls");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, other_ca) = (Ca::new("specd test CA"), Ca::new("somebody else's CA"));
    let ca_pem = ca.write(&dir.join("ca.pem"));
    let (node_cert, node_key) = ca.leaf(&dir, "node", ExtendedKeyUsagePurpose::ServerAuth);
    let (coordinator_cert, coordinator_key) = ca.leaf(&dir, "coordinator", ExtendedKeyUsagePurpose::ClientAuth);
    let (stranger_cert, stranger_key) = other_ca.leaf(&dir, "stranger", ExtendedKeyUsagePurpose::ClientAuth);
    let model = dir.join("model.json");
    std::fs::write(&model, r#"{"vocab_size": 4, "default": [0.4, 0.3, 0.2, 0.1]}"#).unwrap();

    let tls = ["--tls-cert", arg(&node_cert), "--tls-key", arg(&node_key), "--tls-client-ca", arg(&ca_pem)];
    let node = |role: &'static str| [&[role, "--model", arg(&model), "--listen", "127.0.0.1:0"][..], &tls[..]].concat();
    let (_target, target) = start(&node("target"), &[]);
    let (_draft, draft) = start(&node("draft"), &[]);
    let (target_url, draft_url) = (format!("https://{target}"), format!("https://{draft}"));

    // The coordinator with its certificate: a whole generation over mutual TLS.
    let coordinator = [
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--target",
        &target_url,
        "--draft",
        &draft_url,
        "--node-tls-ca",
        arg(&ca_pem),
        "--node-tls-cert",
        arg(&coordinator_cert),
        "--node-tls-key",
        arg(&coordinator_key),
    ];
    let (_coordinator, endpoint) = start(&coordinator, &[]);
    let mut client = GenerationClient::connect(format!("http://{endpoint}")).await.unwrap();
    let request = GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: vec![1] })),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(16), ignore_eos: true, ..Default::default() }),
        ..Default::default()
    };
    let reply = client.generate(request).await.unwrap().into_inner();
    assert_eq!(reply.finish_reason, FinishReason::Length as i32);
    assert_eq!(reply.token_ids.len(), 16);

    assert_eq!(info(&target_url, &ca_pem, Some((&coordinator_cert, &coordinator_key))).await, Ok(()));
    let anonymous = info(&target_url, &ca_pem, None).await;
    assert!(anonymous.is_err(), "a client without a certificate got in");
    let stranger = info(&target_url, &ca_pem, Some((&stranger_cert, &stranger_key))).await;
    assert!(stranger.is_err(), "a certificate from another CA got in");
    let plain = TargetServiceClient::connect(format!("http://{target}")).await;
    let plain_info = match plain {
        Ok(mut client) => client.info(InfoRequest {}).await.map(drop).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    assert!(plain_info.is_err(), "plain text got in");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_serves_its_grpc_api_over_tls_with_a_client_ca() {
    let _host = crate::alone().await;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e/mtls-up");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ca = Ca::new("specd test CA");
    let ca_pem = ca.write(&dir.join("ca.pem"));
    let (server_cert, server_key) = ca.leaf(&dir, "up", ExtendedKeyUsagePurpose::ServerAuth);
    let (client_cert, client_key) = ca.leaf(&dir, "client", ExtendedKeyUsagePurpose::ClientAuth);
    let model = dir.join("model.json");
    std::fs::write(&model, r#"{"vocab_size": 4, "default": [0.4, 0.3, 0.2, 0.1]}"#).unwrap();
    let up = [
        "up",
        "--target-model",
        arg(&model),
        "--draft-model",
        arg(&model),
        "--listen",
        "127.0.0.1:0",
        "--http-listen",
        "off",
        "--tls-cert",
        arg(&server_cert),
        "--tls-key",
        arg(&server_key),
        "--tls-client-ca",
        arg(&ca_pem),
    ];
    let (_up, endpoint) = start(&up, &[]);
    let request = GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: vec![1] })),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(8), ignore_eos: true, ..Default::default() }),
        ..Default::default()
    };
    let generate = |identity: Option<(PathBuf, PathBuf)>| {
        let (ca_pem, request, url) = (ca_pem.clone(), request.clone(), format!("https://{endpoint}"));
        async move {
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(std::fs::read(&ca_pem).unwrap()));
            if let Some((cert, key)) = identity {
                tls = tls.identity(Identity::from_pem(std::fs::read(cert).unwrap(), std::fs::read(key).unwrap()));
            }
            let endpoint = Endpoint::from_shared(url).unwrap().tls_config(tls).map_err(|e| e.to_string())?;
            let channel = endpoint.connect().await.map_err(|e| format!("connect: {e}"))?;
            GenerationClient::new(channel).generate(request).await.map(|r| r.into_inner()).map_err(|e| e.to_string())
        }
    };
    let reply = generate(Some((client_cert, client_key))).await.expect("a generation over mutual TLS");
    assert_eq!(reply.token_ids.len(), 8);
    assert!(generate(None).await.is_err(), "a client without a certificate got in");
    let plain = match GenerationClient::connect(format!("http://{endpoint}")).await {
        Ok(mut client) => client.generate(request).await.map(drop).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    assert!(plain.is_err(), "plain text got in");
}
