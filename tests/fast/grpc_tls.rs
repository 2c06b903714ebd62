//! TLS on the gRPC listener (`grpc_tls`), against the real binary: a TLS client is answered
//! and a plain one is not, and the listener stops on SIGTERM as a plain one does; with a client CA, a client without a certificate is refused; with
//! `client_san`, a certificate for another name is refused.

use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::support::grpc::{self, descriptor, request, OK, OVER_LIMIT};
use crate::support::{
    make_certificates, make_client_certificate, TempDir, Tollgate, SHORT_TIMINGS,
};

/// Two calls per user, then over the limit.
const LIMIT: &str = r#"
[[limits]]
name = "per-user"
rate = 0.001
burst = 2
key = ["descriptor:user"]
[limits.match]
domains = ["edge"]
"#;

/// A CA, the server's certificate for 127.0.0.1, and client certificates for
/// `envoy.example` and `other.example`, all signed by that CA.
fn certificates() -> TempDir {
    let dir = TempDir::new("grpc-tls");
    make_certificates(dir.path());
    make_client_certificate(dir.path(), "envoy", "DNS:envoy.example");
    make_client_certificate(dir.path(), "other", "DNS:other.example");
    dir
}

/// A tollgate whose gRPC listener speaks TLS with `grpc_tls` (TOML inline-table fields).
fn tollgate(certs: &Path, fields: &str) -> (Tollgate, std::net::SocketAddr) {
    let dir = certs.display();
    let config = format!(
        "grpc_tls = {{ cert_file = \"{dir}/cert.pem\", key_file = \"{dir}/key.pem\"{fields} }}\n{LIMIT}"
    );
    grpc::tollgate_with_env(&config, &[SHORT_TIMINGS])
}

/// Asks once over TLS (trusting the test CA), showing the certificate `client` names
/// (`<client>.pem`, `<client>.key`) if any. Any failure, at connection or call, is `Err`.
async fn ask_tls(
    certs: &Path,
    addr: std::net::SocketAddr,
    client: Option<&str>,
) -> Result<RateLimitResponse, String> {
    let read = |name: &str| std::fs::read(certs.join(name)).expect("read a test certificate");
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read("ca.pem")));
    if let Some(stem) = client {
        tls = tls.identity(Identity::from_pem(
            read(&format!("{stem}.pem")),
            read(&format!("{stem}.key")),
        ));
    }
    let endpoint = Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?;
    let channel = endpoint.connect().await.map_err(|e| format!("{e:?}"))?;
    let asked = request("edge", vec![descriptor(&[("user", "alice")])]);
    RateLimitServiceClient::new(channel)
        .should_rate_limit(asked)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| format!("{status:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_is_answered_and_a_plain_text_one_is_not() {
    let certs = certificates();
    let (mut tollgate, addr) = tollgate(certs.path(), "");
    for expected in [OK, OK, OVER_LIMIT] {
        let answer = ask_tls(certs.path(), addr, None).await.expect("an answer");
        assert_eq!(answer.overall_code, expected);
    }
    let plain = async {
        let mut client = RateLimitServiceClient::connect(format!("http://{addr}")).await?;
        let asked = request("edge", vec![descriptor(&[("user", "bob")])]);
        client.should_rate_limit(asked).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    };
    assert!(
        plain.await.is_err(),
        "a plain-text client was answered by a TLS listener"
    );
    // A TLS listener drains and stops as a plain one does: the process exits cleanly.
    tollgate.signal("TERM");
    assert_eq!(tollgate.wait_exit(Duration::from_secs(60)), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_ca_a_client_without_a_certificate_is_refused() {
    let certs = certificates();
    let ca = format!(", client_ca_file = \"{}/ca.pem\"", certs.path().display());
    let (_tollgate, addr) = tollgate(certs.path(), &ca);
    let refused = ask_tls(certs.path(), addr, None).await;
    assert!(refused.is_err(), "answered without a client certificate");
    for client in ["envoy", "other"] {
        let answer = ask_tls(certs.path(), addr, Some(client)).await;
        assert_eq!(answer.expect("an answer").overall_code, OK, "{client}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_san_a_certificate_for_another_name_is_refused() {
    let certs = certificates();
    let fields = format!(
        ", client_ca_file = \"{}/ca.pem\", client_san = \"envoy.example\"",
        certs.path().display()
    );
    let (_tollgate, addr) = tollgate(certs.path(), &fields);
    let refused = ask_tls(certs.path(), addr, Some("other")).await;
    assert!(refused.is_err(), "answered a certificate for other.example");
    let refused = ask_tls(certs.path(), addr, None).await;
    assert!(refused.is_err(), "answered without a client certificate");
    let answer = ask_tls(certs.path(), addr, Some("envoy")).await;
    assert_eq!(answer.expect("an answer").overall_code, OK);
}

/// Whether `ask` gets an answer within 10 s, asked again every 50 ms.
async fn answered<F, A>(ask: F) -> bool
where
    F: Fn() -> A,
    A: std::future::Future<Output = Result<RateLimitResponse, String>>,
{
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < until {
        if ask().await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Replaces `name` in `dir` by `content` as a Kubernetes secret update does: written aside,
/// then renamed over, so a reader never sees half a file.
fn replace(dir: &Path, name: &str, content: &[u8]) {
    let aside = dir.join(format!(".{name}.new"));
    std::fs::write(&aside, content).expect("write the new file");
    std::fs::rename(&aside, dir.join(name)).expect("rename it over the old one");
}

/// A renewed certificate (another CA, another key, the files replaced in place) is served
/// without a restart, as envoyproxy/ratelimit serves one; a replacement that does not load
/// is refused in the log and the running certificate stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_is_served_without_a_restart() {
    let (old, new) = (certificates(), certificates());
    let live = TempDir::new("grpc-tls-live");
    let read = |dir: &TempDir, name: &str| std::fs::read(dir.path().join(name)).expect("read");
    for name in ["cert.pem", "key.pem"] {
        replace(live.path(), name, &read(&old, name));
    }
    let grpc = format!("127.0.0.1:{}", crate::support::free_port());
    let dir = live.path().display();
    let config = format!(
        "grpc_tls = {{ cert_file = \"{dir}/cert.pem\", key_file = \"{dir}/key.pem\" }}\n{LIMIT}"
    );
    let (_tollgate, log) = Tollgate::start_logged(
        &config,
        &[("TOLLGATE_GRPC_LISTEN", grpc.as_str()), SHORT_TIMINGS],
    );
    let addr: std::net::SocketAddr = grpc.parse().expect("an address");
    assert!(
        answered(|| ask_tls(old.path(), addr, None)).await,
        "the first certificate"
    );

    replace(live.path(), "key.pem", &read(&new, "key.pem"));
    replace(live.path(), "cert.pem", &read(&new, "cert.pem"));
    assert!(
        answered(|| ask_tls(new.path(), addr, None)).await,
        "the renewed certificate is served"
    );
    assert!(
        ask_tls(old.path(), addr, None).await.is_err(),
        "the old CA's certificate is no longer served"
    );

    replace(live.path(), "key.pem", b"not a key\n");
    let refused = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        crate::support::wait_until(Duration::from_secs(10), || refused()
            .contains("keeping the running certificates")),
        "a broken key is refused: {}",
        refused()
    );
    assert!(
        ask_tls(new.path(), addr, None).await.is_ok(),
        "the running certificate stays"
    );
}
