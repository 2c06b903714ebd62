use envoy_types::pb::ratelimit::config::ratelimit::v3::{RateLimitPolicy, RateLimitReplace};

use super::*;
use tollgate_core::erl::config::from_yaml;

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

/// A chain of `depth` nodes, the last one limited.
fn chain(depth: usize) -> RateLimitDescriptor {
    let mut node = node("k", "v", per(RateLimitUnit::Minute, 1));
    for _ in 1..depth {
        let mut parent = self::node("k", "v", None);
        parent.descriptors = vec![node];
        node = parent;
    }
    node
}

#[test]
fn a_set_too_deep_too_large_or_too_long_is_refused_before_it_is_built() {
    assert!(rules_from_configs(&[config("c", "d", vec![chain(MAX_DEPTH)])]).is_ok());
    let deep = refusal(&[config("c", "d", vec![chain(MAX_DEPTH + 1)])]);
    assert!(deep.contains("nest more than 16 deep"), "{deep}");

    // All resources together: two halves of the bound pass, one more node does not.
    let wide = |domain: &str, n: usize| {
        let leaves = (0..n)
            .map(|i| node("a", &i.to_string(), per(RateLimitUnit::Minute, 1)))
            .collect();
        config(domain, domain, leaves)
    };
    assert!(rules_from_configs(&[wide("a", MAX_NODES / 2), wide("b", MAX_NODES / 2)]).is_ok());
    let many = refusal(&[wide("a", MAX_NODES / 2), wide("b", MAX_NODES / 2 + 1)]);
    assert!(many.contains("more than 10000 descriptors"), "{many}");

    // A long key high in a tree counts once per node below it.
    let mut top = node(&"k".repeat(MAX_PATH_BYTES / 4), "", None);
    top.descriptors = (0..4)
        .map(|i| node("a", &i.to_string(), per(RateLimitUnit::Minute, 1)))
        .collect();
    let long = refusal(&[config("c", "d", vec![top])]);
    assert!(long.contains("paths take more than"), "{long}");
}
