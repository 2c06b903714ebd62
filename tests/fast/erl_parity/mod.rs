//! envoyproxy/ratelimit as its own deployments run it, against the real binary, a real Redis
//! and a tonic client: YAML in subdirectories of its runtime directory, merged domains
//! (`MERGE_DOMAIN_CONFIG`), the `RateLimit-*` headers (`LIMIT_RESPONSE_HEADERS_ENABLED`), and
//! hostile YAML refused before it is parsed.

use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;

use crate::support::chaos::run_tollgate;
use crate::support::grpc::{self, ask, descriptor, header, request, OK, OVER_LIMIT};
use crate::support::{redis_config, wait_until, RedisServer, TempDir, Tollgate};

mod files;
mod reloads;

/// Runs these tests one after another: each starts a Redis and a tollgate.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn per_minute(domain: &str, key: &str, n: u32) -> String {
    format!("domain: {domain}\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: minute, requests_per_unit: {n}}}\n")
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// envoyproxy/ratelimit's environment for a runtime directory `<root>/rl/config`, its gRPC
/// listener on `grpc_port`, its Redis `redis`.
fn erl_env<'a>(
    root: &'a str,
    grpc_port: &'a str,
    redis: &'a str,
    more: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("RUNTIME_ROOT", root),
        ("RUNTIME_SUBDIRECTORY", "rl"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", redis),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", grpc_port),
        // Generous, as `redis_config`'s: a slow call on a loaded machine must not be answered
        // by `on_error` (without quota headers).
        ("TOLLGATE_STORE__TIMEOUT_MS", "2000"),
    ];
    env.extend_from_slice(more);
    env
}

async fn codes(client: &mut grpc::Client, domain: &str, key: &str, times: usize) -> Vec<i32> {
    let mut codes = Vec::new();
    for _ in 0..times {
        let answer = ask(client, request(domain, vec![descriptor(&[(key, "v")])])).await;
        codes.push(answer.overall_code);
    }
    codes
}

fn requests_per_unit(response: &RateLimitResponse) -> u32 {
    response.statuses[0]
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit)
}

/// service/ratelimit.go with `LIMIT_RESPONSE_HEADERS_ENABLED`: the answer carries
/// `RateLimit-Limit`, `-Remaining` and `-Reset` of the descriptor nearest its limit, under the
/// names `LIMIT_*_HEADER` give; without the variable, none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_response_headers_show_the_descriptor_nearest_its_limit() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let dir = TempDir::new("erl-headers");
    let yaml = "domain: d\ndescriptors:\n  - key: wide\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: narrow\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    write(&dir.path().join("rl/config/d.yaml"), yaml);
    let (root, port) = (
        dir.path().display().to_string(),
        crate::support::free_port().to_string(),
    );
    let redis_url = format!("127.0.0.1:{}", redis.port);
    let env = erl_env(
        &root,
        &port,
        &redis_url,
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_REMAINING_HEADER", "X-Left"),
        ],
    );
    let tollgate = Tollgate::start_with_env("", &env);
    let mut client = grpc::client(format!("127.0.0.1:{port}").parse().unwrap()).await;
    let both = || {
        request(
            "d",
            vec![descriptor(&[("wide", "u")]), descriptor(&[("narrow", "u")])],
        )
    };
    let first = ask(&mut client, both()).await;
    assert_eq!(first.overall_code, OK);
    assert_eq!(header(&first, "RateLimit-Limit"), Some("2"));
    assert_eq!(header(&first, "X-Left"), Some("1"));
    assert_eq!(header(&first, "RateLimit-Remaining"), None, "renamed");
    // Seconds until the narrow bucket is full again: one token at 2 per minute.
    let reset: u64 = header(&first, "RateLimit-Reset").unwrap().parse().unwrap();
    assert!((29..=31).contains(&reset), "{reset}");
    ask(&mut client, both()).await;
    let over = ask(&mut client, both()).await;
    assert_eq!(over.overall_code, OVER_LIMIT);
    assert_eq!(header(&over, "RateLimit-Limit"), Some("2"));
    assert_eq!(header(&over, "X-Left"), Some("0"));
    drop(tollgate);

    let port = crate::support::free_port().to_string();
    let _plain = Tollgate::start_with_env("", &erl_env(&root, &port, &redis_url, &[]));
    let mut client = grpc::client(format!("127.0.0.1:{port}").parse().unwrap()).await;
    let answer = ask(
        &mut client,
        request("d", vec![descriptor(&[("wide", "fresh")])]),
    )
    .await;
    assert_eq!(header(&answer, "RateLimit-Limit"), None, "off by default");
}

/// The same family on `/check` through `[response] headers`, renamed by
/// `[response.ratelimit_names]`, and not there by default.
#[test]
fn the_ratelimit_family_renders_on_check_when_configured() {
    let redis = RedisServer::start();
    let limits = "[[limits]]\nname = \"per-ip\"\nrate = 1\nburst = 4\nkey = [\"ip\"]\n";
    let configured = format!(
        "[response]\nheaders = [\"ratelimit\"]\n[response.ratelimit_names]\nreset = \"X-Reset\"\n\n{limits}"
    );
    let tollgate = Tollgate::start(&redis_config(&redis, "", &configured));
    let answer = tollgate.check(&[("X-Forwarded-For", "203.0.113.7")]);
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("ratelimit-limit"), Some("4"));
    assert_eq!(answer.header("ratelimit-remaining"), Some("3"));
    assert_eq!(answer.header("x-reset"), Some("1"));
    assert_eq!(
        answer.header("x-ratelimit-limit"),
        None,
        "only the families listed"
    );
    drop(tollgate);
    let tollgate = Tollgate::start(&redis_config(&redis, "", limits));
    let answer = tollgate.check(&[("X-Forwarded-For", "203.0.113.8")]);
    assert_eq!(answer.header("ratelimit-limit"), None, "off by default");
    assert_eq!(answer.header("x-ratelimit-limit"), Some("4"));
}

/// A bad header name in `[response.ratelimit_names]` stops the start (exit 2, naming the key).
#[test]
fn a_ratelimit_name_that_is_no_header_name_is_refused() {
    let dir = TempDir::new("names");
    let path = dir.write(
        "tollgate.toml",
        "[response.ratelimit_names]\nlimit = \"Rate Limit\"\n",
    );
    let (code, _, stderr) =
        run_tollgate(&["validate", "--config", &path.display().to_string()], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("response.ratelimit_names.limit"),
        "{stderr}"
    );
}

/// service/ratelimit.go `ratelimitToMetadata` with `RESPONSE_DYNAMIC_METADATA`: per
/// descriptor its `entries` (`key=value`) and its own `hitsAddend`; `metadata` merges the rules
/// of the descriptors that passed: a shadow-mode rule over its limit passed (its status is OK),
/// an unlimited one is left out, one over its limit is left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_metadata_lists_each_descriptor_and_the_rules_that_passed() {
    use envoy_types::pb::google::protobuf::value::Kind;
    use envoy_types::pb::google::protobuf::{Struct, UInt64Value, Value};

    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let dir = TempDir::new("erl-metadata");
    let yaml = "domain: d
descriptors:
  - key: shadow
    shadow_mode: true
    metadata: {from: shadow}
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: free
    metadata: {from_free: yes}
    rate_limit: {unlimited: true}
  - key: tight
    metadata: {from_tight: 1}
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    write(&dir.path().join("rl/config/d.yaml"), yaml);
    let (root, port) = (
        dir.path().display().to_string(),
        crate::support::free_port().to_string(),
    );
    let redis_url = format!("127.0.0.1:{}", redis.port);
    let env = erl_env(
        &root,
        &port,
        &redis_url,
        &[("RESPONSE_DYNAMIC_METADATA", "true")],
    );
    let _tollgate = Tollgate::start_with_env("", &env);
    let mut client = grpc::client(format!("127.0.0.1:{port}").parse().unwrap()).await;
    let mut tight = descriptor(&[("tight", "t")]);
    tight.hits_addend = Some(UInt64Value { value: 2 });
    let answer = ask(
        &mut client,
        request(
            "d",
            vec![
                descriptor(&[("shadow", "s")]),
                descriptor(&[("free", "f")]),
                tight,
            ],
        ),
    )
    .await;
    assert_eq!(
        answer.statuses[2].code, OVER_LIMIT,
        "2 hits on a limit of 1"
    );
    let meta = answer.dynamic_metadata.expect("dynamic metadata");
    let get = |s: &Struct, name: &str| s.fields.get(name).and_then(|v| v.kind.clone());
    let Some(Kind::ListValue(descriptors)) = get(&meta, "descriptors") else {
        panic!("no descriptors: {meta:?}");
    };
    let one = |i: usize| match &descriptors.values[i].kind {
        Some(Kind::StructValue(s)) => s.clone(),
        other => panic!("descriptor {i}: {other:?}"),
    };
    let text = |v: &Value| match &v.kind {
        Some(Kind::StringValue(s)) => s.clone(),
        other => panic!("{other:?}"),
    };
    let Some(Kind::ListValue(entries)) = get(&one(0), "entries") else {
        panic!("no entries");
    };
    assert_eq!(
        entries.values.iter().map(text).collect::<Vec<_>>(),
        ["shadow=s"]
    );
    assert_eq!(get(&one(2), "hitsAddend"), Some(Kind::NumberValue(2.0)));
    assert_eq!(
        get(&one(0), "hitsAddend"),
        None,
        "only when the descriptor has its own"
    );
    let Some(Kind::StructValue(passed)) = get(&meta, "metadata") else {
        panic!("no metadata: {meta:?}");
    };
    let mut keys: Vec<&str> = passed.fields.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["from"],
        "the shadow rule passed; unlimited and over left out"
    );
}
