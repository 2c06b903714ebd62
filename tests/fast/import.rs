//! `tollgate import envoy-ratelimit`: envoyproxy/ratelimit YAML converted to TOML that
//! `validate` accepts and that decides over gRPC exactly what the YAML decides when tollgate
//! serves it as it is; and every file envoyproxy/ratelimit refuses, refused.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::UInt64Value;

use crate::support::chaos::run_tollgate;
use crate::support::deploy::repo_path;
use crate::support::grpc::{self, ask, descriptor, request, OK, OVER_LIMIT};
use crate::support::{redis_config, RedisServer, TempDir};

fn fixture(name: &str) -> String {
    repo_path(&format!("tests/fixtures/envoy-ratelimit/{name}"))
        .display()
        .to_string()
}

fn import(files: &[String]) -> String {
    let mut args = vec!["import", "envoy-ratelimit"];
    args.extend(files.iter().map(String::as_str));
    let (code, stdout, stderr) = run_tollgate(&args, &[]);
    assert_eq!(code, Some(0), "import failed: {stderr}");
    stdout
}

#[test]
fn every_node_becomes_a_rule_and_the_result_validates() {
    let toml = import(&[fixture("sms.yaml"), fixture("edge.yaml")]);
    for expected in [
        "[[envoy.rules]]\ndomain = \"sms\"\npath = [{ key = \"category\", value = \"promo\" }, { key = \"phone\" }]\nlimit = \"sms-category-promo-phone\"\nrate_limit = { requests_per_unit = 3, unit = \"day\" }",
        "path = [{ key = \"route\", value = \"search\" }, { key = \"tenant\", value = \"trial\" }]\nlimit = \"trial_search\"\nshadow_mode = true\nrate_limit = { requests_per_unit = 30, unit = \"minute\", name = \"trial_search\" }",
        "replaces = [\"trial_search\"]",
        "rate_limit = { unlimited = true }",
        "path = [{ key = \"client_ip\", value = \"203.0.113.9\" }]\nrate_limit = { requests_per_unit = 0, unit = \"second\" }",
        "path = [{ key = \"api\", value = \"v1*\" }]",
        "# detailed_metric/value_to_metric: accepted, no effect",
    ] {
        assert!(toml.contains(expected), "missing {expected:?} in:\n{toml}");
    }
    let dir = TempDir::new("import");
    let path = dir.write("imported.toml", &toml);
    let (code, stdout, stderr) =
        run_tollgate(&["validate", "--config", &path.display().to_string()], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("envoy rules   11 (9 with rate_limit) in domains [edge, sms]"),
        "{stdout}"
    );
}

/// envoyproxy/ratelimit test/config: every file its config tests expect it to refuse
/// (bad_limit_unit, duplicate_key, empty_key, misspelled_key, misspelled_key2, non_map_list,
/// non_string_key, replaces_empty, replaces_self, unlimited_with_unit, empty_domain,
/// bad_yaml, duplicate_domain), plus share_threshold without a wildcard and an unreadable
/// file: exit 2, one line naming the file and the rule.
#[test]
fn what_envoyproxy_ratelimit_refuses_exits_2_naming_the_rule() {
    let dir = TempDir::new("import-bad");
    let node = |body: &str| format!("domain: d\ndescriptors:\n  - key: k1\n    value: v1\n{body}");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "bad_unit.yaml",
            node("    rate_limit: {unit: foo, requests_per_unit: 5}\n"),
            "invalid rate limit unit \"foo\"",
        ),
        (
            "duplicate_key.yaml",
            node("  - key: k1\n    value: v1\n"),
            "duplicate descriptor composite key",
        ),
        (
            "empty_key.yaml",
            "domain: d\ndescriptors:\n  - value: v1\n".into(),
            "empty key",
        ),
        (
            "misspelled.yaml",
            node("    ratelimit: {unit: day, requests_per_unit: 5}\n"),
            "unknown key \"ratelimit\"",
        ),
        (
            "misspelled2.yaml",
            node("    rate_limit: {unit: day, requestsperunit: 5}\n"),
            "unknown key \"requestsperunit\"",
        ),
        (
            "non_map_list.yaml",
            "domain: d\ndescriptors:\n  - a\n  - b\n".into(),
            "list of type other than map",
        ),
        (
            "non_string_key.yaml",
            "0.25: d\ndescriptors: []\n".into(),
            "not of type string",
        ),
        (
            "replaces_empty.yaml",
            node("    descriptors:\n      - key: sub\n        rate_limit: {name: me, unit: second, requests_per_unit: 5, replaces: [{name: }]}\n"),
            "d (k1, v1) (sub, *): should not have an empty replaces entry",
        ),
        (
            "replaces_self.yaml",
            node("    descriptors:\n      - key: sub\n        rate_limit: {name: me, unit: second, requests_per_unit: 5, replaces: [{name: me}]}\n"),
            "d (k1, v1) (sub, *): replaces should not contain name of same descriptor",
        ),
        (
            "unlimited_with_unit.yaml",
            node("    rate_limit: {unlimited: true, unit: day, requests_per_unit: 25}\n"),
            "should not specify rate limit unit when unlimited",
        ),
        ("empty_domain.yaml", "domain: \"\"\ndescriptors: []\n".into(), "empty domain"),
        ("bad_yaml.yaml", "domain: [unclosed\n".into(), "error loading config file"),
        (
            "share.yaml",
            node("    share_threshold: true\n    rate_limit: {unit: day, requests_per_unit: 5}\n"),
            "share_threshold can only be used with wildcard values",
        ),
    ];
    for (name, yaml, why) in &cases {
        let path = dir.write(name, yaml).display().to_string();
        let (code, stdout, stderr) = run_tollgate(&["import", "envoy-ratelimit", &path], &[]);
        assert_eq!(code, Some(2), "{name}: {stdout}{stderr}");
        assert!(stderr.contains(&path), "{name}: {stderr}");
        assert!(stderr.contains(why), "{name}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
    }
    let good = dir.write("good.yaml", "domain: d\ndescriptors: []\n");
    let again = dir.write("again.yaml", "domain: d\ndescriptors: []\n");
    let (code, _, stderr) = run_tollgate(
        &[
            "import",
            "envoy-ratelimit",
            &good.display().to_string(),
            &again.display().to_string(),
        ],
        &[],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("duplicate domain \"d\""), "{stderr}");
    let absent = dir.path().join("absent.yaml").display().to_string();
    let (code, _, stderr) = run_tollgate(&["import", "envoy-ratelimit", &absent], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains(&absent), "{stderr}");
}

/// One descriptor's code, limit (requests per unit, unit, name) and remaining.
type Status = (i32, Option<(u32, i32, String)>, u32);

type Metadata = Option<envoy_types::pb::google::protobuf::Struct>;

/// What a scenario compares: overall code, per descriptor code, limit and remaining, and the
/// dynamic metadata.
fn decision(response: &RateLimitResponse) -> (i32, Vec<Status>, Metadata) {
    let statuses = response
        .statuses
        .iter()
        .map(|s| {
            let limit = s
                .current_limit
                .as_ref()
                .map(|l| (l.requests_per_unit, l.unit, l.name.clone()));
            (s.code, limit, s.limit_remaining)
        })
        .collect();
    (
        response.overall_code,
        statuses,
        response.dynamic_metadata.clone(),
    )
}

fn looked(mut d: RateLimitDescriptor) -> RateLimitDescriptor {
    d.hits_addend = Some(UInt64Value { value: 0 });
    d
}

/// The same scenario against the YAML served as it is (`[envoy] config_dir`) and against the
/// imported TOML, each with its own Redis: every answer equal, and the scenario itself covers
/// each feature (a value's rule over the key's, no limit, wildcards, share_threshold,
/// replaces, 0 per unit, unlimited, quota and shadow mode, hits_addend 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_imported_toml_decides_exactly_as_the_yaml() {
    let yaml = "domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: per-user}
  - key: user
    value: vip
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: user
    value: staff
  - key: user
    value: banned
    rate_limit: {unit: day, requests_per_unit: 0}
  - key: user
    value: root
    rate_limit: {unlimited: true}
  - key: path
    value: /img/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /api*v1
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 4}
  - key: plan
    value: gold
    rate_limit:
      unit: minute
      requests_per_unit: 50
      replaces: [{name: per-user}]
  - key: credits
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: trial
    shadow_mode: true
    metadata: {team: {name: growth, ids: [1, 2]}}
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    let dir = TempDir::new("import-same");
    let yaml_dir = dir.path().join("erl");
    std::fs::create_dir_all(&yaml_dir).unwrap();
    let file = yaml_dir.join("shop.yaml");
    std::fs::write(&file, yaml).unwrap();
    let toml = import(&[file.display().to_string()]);

    let scenario: Vec<Vec<RateLimitDescriptor>> = {
        let d = descriptor;
        let mut steps = Vec::new();
        for _ in 0..4 {
            steps.push(vec![d(&[("user", "ann")])]);
            steps.push(vec![d(&[("user", "vip")])]);
            steps.push(vec![d(&[("user", "staff")])]);
            steps.push(vec![d(&[("path", "/img/a.png")]), d(&[("user", "root")])]);
            steps.push(vec![d(&[("path", "/img/b.png")])]);
            steps.push(vec![d(&[("path", "/api/x/v1"), ("method", "GET")])]);
            steps.push(vec![d(&[("path", "/api/x/v1")])]);
            steps.push(vec![d(&[("user", "bob")]), d(&[("plan", "gold")])]);
            steps.push(vec![d(&[("credits", "c")]), d(&[("credits", "c2")])]);
            steps.push(vec![d(&[("trial", "t")])]);
            steps.push(vec![looked(d(&[("user", "carl")]))]);
            steps.push(vec![d(&[("user", "banned")]), d(&[("user", "dan")])]);
            steps.push(vec![looked(d(&[("user", "banned")]))]);
        }
        steps
    };
    let mut answers = Vec::new();
    for config in [
        format!(
            "[envoy]\nconfig_dir = {:?}\ndynamic_metadata = true\n",
            yaml_dir.display().to_string()
        ),
        format!("{toml}\n[envoy]\ndynamic_metadata = true\n"),
    ] {
        let redis = RedisServer::start();
        let (_tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", &config));
        let mut client = grpc::client(addr).await;
        let mut these = Vec::new();
        for descriptors in &scenario {
            these.push(decision(
                &ask(&mut client, request("shop", descriptors.clone())).await,
            ));
        }
        answers.push(these);
    }
    assert_eq!(answers[0], answers[1]);
    // The scenario is not vacuous: both codes occur, and the 4th request of a user is over.
    let codes: Vec<i32> = answers[0].iter().map(|(code, _, _)| *code).collect();
    assert!(codes.contains(&OK) && codes.contains(&OVER_LIMIT));
    assert_eq!(answers[0][39].0, OVER_LIMIT, "{:?}", answers[0][39]);
    let first = &answers[0];
    assert_eq!(
        first[1].1,
        [(OK, Some((5, 3, String::new())), 4)],
        "vip: 5/HOUR"
    );
    assert_eq!(first[2].1, [(OK, None, 0)], "staff: no limit");
    assert_eq!(first[3].1[1], (OK, None, u32::MAX), "root: unlimited");
    assert_eq!(first[4].1[0].2, 0, "/img/* shares one bucket of 2");
    assert_eq!(first[7].1[0], (OK, None, 0), "per-user replaced");
    assert_eq!(first[8].0, OK, "quotas not used up");
    assert!(
        format!("{:?}", first[9].2).contains("growth"),
        "trial's metadata: {:?}",
        first[9].2
    );
    assert_eq!(first[11].0, OVER_LIMIT, "0 per day");
}
