use envoy_types::pb::ratelimit::config::ratelimit::v3::{RateLimitPolicy, RateLimitReplace};

use super::*;
use crate::config::envoy::from_yaml;

fn node(key: &str, value: &str, limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.into(),
        value: value.into(),
        rate_limit: limit,
        ..RateLimitDescriptor::default()
    }
}

fn per(unit: RateLimitUnit, requests: u32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        unit: unit as i32,
        requests_per_unit: requests,
        ..RateLimitPolicy::default()
    })
}

fn config(name: &str, domain: &str, descriptors: Vec<RateLimitDescriptor>) -> XdsRateLimitConfig {
    XdsRateLimitConfig {
        name: name.into(),
        domain: domain.into(),
        descriptors,
    }
}

fn refusal(configs: &[XdsRateLimitConfig]) -> String {
    rules_from_configs(configs).unwrap_err().to_string()
}

#[test]
fn a_resource_becomes_the_rules_its_yaml_becomes() {
    let yaml = "domain: d
descriptors:
  - key: a
    value: x
    shadow_mode: true
    descriptors:
      - key: b
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 60, name: n, replaces: [{name: other}]}
  - key: c
    quota_mode: true
    rate_limit: {unlimited: true}
    metadata: {team: blue, nested: {on: true}}
  - key: e
";
    let (_, from_file) = from_yaml("f.yaml", yaml).unwrap();
    let mut b = node("b", "", per(RateLimitUnit::Minute, 60));
    b.detailed_metric = true;
    if let Some(limit) = b.rate_limit.as_mut() {
        limit.name = "n".into();
        limit.replaces = vec![RateLimitReplace {
            name: "other".into(),
        }];
    }
    let mut a = node("a", "x", None);
    a.shadow_mode = true;
    a.descriptors = vec![b];
    let mut c = node(
        "c",
        "",
        Some(RateLimitPolicy {
            unlimited: true,
            ..RateLimitPolicy::default()
        }),
    );
    c.quota_mode = true;
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.into())),
    };
    let nested = Struct {
        fields: [(
            "on".to_string(),
            Value {
                kind: Some(Kind::BoolValue(true)),
            },
        )]
        .into(),
    };
    c.metadata = Some(Struct {
        fields: [
            ("team".to_string(), string("blue")),
            (
                "nested".to_string(),
                Value {
                    kind: Some(Kind::StructValue(nested)),
                },
            ),
        ]
        .into(),
    });
    let fed = rules_from_configs(&[config("n1", "d", vec![a, c, node("e", "", None)])]).unwrap();
    assert_eq!(fed, from_file);
}

#[test]
fn what_the_yaml_loader_refuses_is_refused_naming_the_resource() {
    let twice = vec![
        node("k", "v", per(RateLimitUnit::Second, 1)),
        node("k", "v", per(RateLimitUnit::Second, 2)),
    ];
    let duplicate = refusal(&[config("mine", "d", twice)]);
    assert!(duplicate.starts_with("xds config \"mine\""), "{duplicate}");
    assert!(duplicate.contains("duplicate descriptor composite key"));
    assert!(refusal(&[config(
        "c",
        "d",
        vec![node("k", "", per(RateLimitUnit::Unknown, 5))]
    )])
    .contains("invalid rate limit unit \"\""));
    let mut strange = node("k", "", per(RateLimitUnit::Second, 5));
    if let Some(limit) = strange.rate_limit.as_mut() {
        limit.unit = 42;
    }
    assert!(refusal(&[config("c", "d", vec![strange])]).contains("\"42\""));
    let mut both = node("k", "", per(RateLimitUnit::Day, 5));
    if let Some(limit) = both.rate_limit.as_mut() {
        limit.unlimited = true;
    }
    assert!(refusal(&[config("c", "d", vec![both])]).contains("when unlimited"));
    assert!(refusal(&[config("c", "", vec![])]).contains("empty domain"));
    assert!(refusal(&[config("c", "d", vec![node("", "v", None)])]).contains("empty key"));
    let two = refusal(&[config("one", "d", vec![]), config("two", "d", vec![])]);
    assert!(
        two.contains("duplicate domain") && two.contains("\"one\""),
        "{two}"
    );
}

#[test]
fn resources_of_another_type_or_that_do_not_decode_are_refused() {
    let wrong_type = Any {
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        value: Vec::new(),
    };
    assert!(rules_from_resources(&[wrong_type])
        .unwrap_err()
        .reason
        .contains("is not"));
    let garbage = Any {
        type_url: RESOURCE_TYPE.into(),
        value: vec![0xff, 0xff, 0xff],
    };
    assert!(rules_from_resources(&[garbage])
        .unwrap_err()
        .reason
        .contains("does not decode"));
    let good = Any {
        type_url: RESOURCE_TYPE.into(),
        value: config("c", "d", vec![node("k", "", per(RateLimitUnit::Hour, 3))]).encode_to_vec(),
    };
    let rules = rules_from_resources(&[good]).unwrap();
    assert_eq!(
        rules[0].rate_limit.as_ref().map(|l| l.unit.as_str()),
        Some("hour")
    );
    assert!(
        rules_from_resources(&[]).unwrap().is_empty(),
        "no resource: no rule"
    );
}

fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    }
}

#[test]
fn envoyproxy_ratelimit_variables_set_the_client_as_it_reads_them() {
    assert_eq!(from_erl_env(env(&[])).unwrap(), XdsConfig::default());
    let xds = from_erl_env(env(&[
        ("CONFIG_GRPC_XDS_SERVER_URL", "xds.example:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "ratelimit-1"),
        ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,skipped,team=b=c"),
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "1m1.5s"),
        (
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "X-Tenant:blue,x-b:1:2",
        ),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "false"),
    ]))
    .unwrap();
    assert_eq!(xds.server, "xds.example:18001");
    assert_eq!(xds.node_id, "ratelimit-1");
    let metadata: Vec<(&str, &str)> = xds
        .node_metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(metadata, [("team", "b=c"), ("zone", "a")]);
    assert_eq!(xds.retry_ms, 61_500);
    assert_eq!(xds.headers["x-tenant"], "blue");
    assert_eq!(xds.headers["x-b"], "1:2");
}

#[test]
fn bad_variables_are_refused_naming_them() {
    let key =
        |pairs: &'static [(&'static str, &'static str)]| from_erl_env(env(pairs)).unwrap_err().key;
    assert_eq!(
        key(&[("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true")]),
        "CONFIG_GRPC_XDS_SERVER_USE_TLS"
    );
    assert_eq!(
        key(&[("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3")]),
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"
    );
    assert_eq!(
        key(&[("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "0s")]),
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"
    );
    assert_eq!(
        key(&[("CONFIG_GRPC_XDS_SERVER_URL", "http://xds:18000")]),
        "CONFIG_GRPC_XDS_SERVER_URL"
    );
    assert_eq!(
        key(&[("CONFIG_GRPC_XDS_NODE_ID", "")]),
        "CONFIG_GRPC_XDS_NODE_ID"
    );
    assert_eq!(
        key(&[("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "novalue")]),
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"
    );
}

#[test]
fn go_durations_are_read_as_go_reads_them() {
    for (text, ms) in [
        ("3s", Some(3_000)),
        ("500ms", Some(500)),
        ("1m30s", Some(90_000)),
        ("1.5h", Some(5_400_000)),
        (".5s", Some(500)),
        ("1us", Some(1)),
        ("0", Some(0)),
        ("", None),
        ("3", None),
        ("-1s", None),
        ("1d", None),
        ("s", None),
    ] {
        assert_eq!(go_duration_ms(text), ms, "{text:?}");
    }
}

#[test]
fn host_port_is_all_a_server_may_be() {
    for good in [
        "localhost:18000",
        "10.0.0.1:1",
        "[::1]:18000",
        "eg.svc.cluster.local:18001",
    ] {
        assert!(is_host_port(good), "{good}");
    }
    for bad in [
        "localhost",
        ":18000",
        "host:0",
        "host:99999",
        "dns:///host:1",
        "::1:80",
    ] {
        assert!(!is_host_port(bad), "{bad}");
    }
}
