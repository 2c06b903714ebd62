use super::*;
use crate::erl::config::from_yaml;

fn tree(yaml: &str) -> ErlRules {
    let (_, rules) = from_yaml("t.yaml", yaml).expect("valid yaml");
    ErlRules::compile(&rules, 0, &mut HashSet::new())
        .expect("compiles")
        .0
}

fn entries<'e>(
    pairs: &'e [(&'e str, &'e str)],
) -> impl Iterator<Item = (&'e str, &'e str)> + Clone {
    pairs.iter().copied()
}

/// The rule's requests_per_unit, 0 for none.
fn reached(tree: &ErlRules, pairs: &[(&str, &str)]) -> u32 {
    tree.lookup("d", entries(pairs))
        .and_then(|f| f.rule)
        .map_or(0, |r| tree.rules[r].requests_per_unit)
}

const BASIC: &str = "domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: k
    value: v
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: k
    value: bare
  - key: k
    value: parent
    descriptors:
      - key: sub
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: w
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: w
    value: foobar
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: m
    value: a*b*c
    rate_limit: {unit: minute, requests_per_unit: 6}
";

/// envoyproxy/ratelimit test/config/config_test.go: TestBasicConfig (value beats key),
/// TestWildcardConfig (prefix, middle and multiple wildcards; exact beats wildcard), and a
/// value without rate_limit meaning no limit.
#[test]
fn the_most_specific_node_of_each_level_decides() {
    let tree = tree(BASIC);
    assert_eq!(reached(&tree, &[("k", "v")]), 2);
    assert_eq!(reached(&tree, &[("k", "other")]), 1);
    assert_eq!(reached(&tree, &[("k", "bare")]), 0);
    assert_eq!(reached(&tree, &[("k", "parent")]), 0);
    assert_eq!(reached(&tree, &[("k", "parent"), ("sub", "x")]), 3);
    // The default node has no nested rules: a longer descriptor ends with no limit.
    assert_eq!(reached(&tree, &[("k", "other"), ("sub", "x")]), 0);
    assert_eq!(reached(&tree, &[("w", "foo")]), 4);
    assert_eq!(reached(&tree, &[("w", "foozzz")]), 4);
    assert_eq!(reached(&tree, &[("w", "foobar")]), 5);
    assert_eq!(reached(&tree, &[("w", "fo")]), 0);
    assert_eq!(reached(&tree, &[("m", "abc")]), 6);
    assert_eq!(reached(&tree, &[("m", "a-b-c")]), 6);
    assert_eq!(reached(&tree, &[("m", "acb")]), 0);
    assert_eq!(reached(&tree, &[("nothing", "x")]), 0);
    assert!(tree.lookup("unknown", entries(&[("k", "v")])).is_none());
}

#[test]
fn wildcards_match_like_envoyproxy_ratelimit() {
    let parts = |p: &str| p.split('*').map(str::to_string).collect::<Vec<_>>();
    assert!(wildcard_match(&parts("k_foo*"), "k_foo"));
    assert!(wildcard_match(&parts("k_*bar"), "k_xbar"));
    assert!(!wildcard_match(&parts("k_a*a"), "k_a"));
    assert!(wildcard_match(&parts("k_a*a"), "k_aa"));
    assert!(wildcard_match(&parts("k_x*y*z"), "k_xyz"));
    assert!(!wildcard_match(&parts("k_x*y*z"), "k_xzy"));
    assert!(wildcard_match(&parts("exact"), "exact"));
}

/// envoyproxy/ratelimit test/config share_threshold.yaml: every value a shared wildcard
/// matches keys on the pattern; an explicit value still wins over it.
#[test]
fn a_shared_wildcard_keys_on_its_pattern() {
    let tree = tree(
        "domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
",
    );
    let found = tree
        .lookup("d", entries(&[("files", "files/a.txt")]))
        .unwrap();
    assert_eq!(tree.keyed_value(&found, 0, "files/a.txt"), b"files/*");
    let found = tree.lookup("d", entries(&[("file", "test1")])).unwrap();
    assert_eq!(tree.keyed_value(&found, 0, "test1"), b"test1");
}

/// The stats key of the rule a descriptor reaches, spelled for that descriptor.
fn stats_key(tree: &ErlRules, domain: &str, pairs: &[(&str, &str)]) -> String {
    let wanted = entries(pairs);
    let rule = tree
        .lookup(domain, wanted.clone())
        .and_then(|f| f.rule)
        .expect("a rule");
    let mut scratch = String::new();
    tree.rules[rule]
        .stats
        .spell(wanted, &mut scratch)
        .to_string()
}

/// envoyproxy/ratelimit test/config/config_test.go: TestDetailedMetric.
#[test]
fn detailed_metric_puts_the_request_values_in_the_stats_key() {
    let tree = tree(
        "domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_2
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5000}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: key-1
    descriptors:
      - key: key-2
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: plain
    descriptors:
      - key: sub
        rate_limit: {unit: minute, requests_per_unit: 5}
",
    );
    let key = |pairs: &[(&str, &str)]| stats_key(&tree, "nested", pairs);
    assert_eq!(
        key(&[("key_1", "value-for-key-1")]),
        "nested.key_1_value-for-key-1"
    );
    assert_eq!(key(&[("key_2", "key-2-value")]), "nested.key_2_key-2-value");
    assert_eq!(
        key(&[("key_2", "key-2-value"), ("key_3", "requested-key3-value")]),
        "nested.key_2_key-2-value.key_3_requested-key3-value"
    );
    assert_eq!(
        key(&[("key-1", "value-1"), ("key-2", "value-2")]),
        "nested.key-1_value-1.key-2_value-2"
    );
    assert_eq!(
        key(&[("plain", "value-1"), ("sub", "value-2")]),
        "nested.plain.sub"
    );
    // An empty value still gets its underscore, as there.
    assert_eq!(key(&[("key_1", "")]), "nested.key_1_");
    let fixed = tree.lookup("nested", entries(&[("plain", "a"), ("sub", "b")]));
    let rule = &tree.rules[fixed.unwrap().rule.unwrap()];
    assert!(matches!(rule.stats, StatsKey::Fixed(_)));
}

/// TestValueToMetric_*: a key-only or wildcard node with value_to_metric spells the
/// request's value at its level, and only there.
#[test]
fn value_to_metric_spells_the_value_at_its_own_level() {
    let tree = tree(
        "domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: fixed
    value: v
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {unit: second, requests_per_unit: 1}
",
    );
    let key = |pairs: &[(&str, &str)]| stats_key(&tree, "domain", pairs);
    assert_eq!(
        key(&[
            ("route", "draw"),
            ("http_method", "GET"),
            ("subject_id", "123")
        ]),
        "domain.route_draw.http_method_GET.subject_id"
    );
    assert_eq!(key(&[("k1", "A"), ("k2", "foo")]), "domain.k1_A.k2");
    assert_eq!(key(&[("k1", ""), ("k2", "foo")]), "domain.k1.k2");
    assert_eq!(key(&[("fixed", "v"), ("k2", "x")]), "domain.fixed_v.k2");
}

/// TestWildcardStatsBehavior: a wildcard keeps its pattern unless value_to_metric, and
/// share_threshold keeps it even then; detailed_metric with a shared wildcard keeps the
/// pattern at that level only.
#[test]
fn wildcards_keep_their_pattern_unless_asked() {
    let tree = tree(
        "domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: {unit: minute, requests_per_unit: 20}
  - key: told
    value: foo*bar*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: shared
    value: foo*
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: files
    value: f*
    share_threshold: true
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 20}
",
    );
    let key = |pairs: &[(&str, &str)]| stats_key(&tree, "test-domain", pairs);
    assert_eq!(key(&[("wild", "foo1")]), "test-domain.wild_foo*");
    assert_eq!(
        key(&[("wild", "foo1"), ("other", "bar"), ("limit", "X")]),
        "test-domain.wild_foo*.other_bar.limit"
    );
    assert_eq!(
        key(&[("told", "foo123bar456")]),
        "test-domain.told_foo123bar456"
    );
    assert_eq!(key(&[("shared", "foo1")]), "test-domain.shared_foo*");
    assert_eq!(
        key(&[("files", "f1"), ("user", "")]),
        "test-domain.files_f*.user"
    );
    assert_eq!(
        key(&[("files", "f1"), ("user", "u")]),
        "test-domain.files_f*.user_u"
    );
}

/// envoyproxy/ratelimit's stat names: `:` and `|` and the dots of IPv4 addresses become
/// `_`; a CIDR's `/` and other dots stay (Envoy Gateway's e2e test reads
/// `masked_remote_address_0_0_0_0/0`).
#[test]
fn stats_keys_are_sanitized_as_stat_names() {
    let sanitized = |text: &str| {
        let mut name = text.to_string();
        sanitize(&mut name);
        name
    };
    assert_eq!(
        sanitized("d.masked_remote_address_0.0.0.0/0"),
        "d.masked_remote_address_0_0_0_0/0"
    );
    assert_eq!(sanitized("d.k_a:b|c"), "d.k_a_b_c");
    assert_eq!(sanitized("d.ip_192.168.10.200.x"), "d.ip_192_168_10_200.x");
    // The longest run that still makes an address, then the next one.
    assert_eq!(sanitized("d.v_1234.5.6.7"), "d.v_1234_5_6_7");
    assert_eq!(sanitized("d.v_1.2.3"), "d.v_1.2.3");
    assert_eq!(sanitized("1.2.3.4.5.6.7.8"), "1_2_3_4.5_6_7_8");
    // Control characters would end a statsd line inside the key.
    assert_eq!(
        sanitized("d.k_a\nb\rc\0d\x1be\x7ff\tg"),
        "d.k_a_b_c_d_e_f_g"
    );
    assert_eq!(sanitized("d.k_\n"), "d.k__");
    // Other characters stay as they are, multi-byte ones whole.
    assert_eq!(sanitized("d.k_é\u{85}~"), "d.k_é\u{85}~");
    let mut own = String::new();
    request_limit_stats_key("d", entries(&[("ip", "10.0.0.1"), ("k", "")]), &mut own);
    assert_eq!(own, "d.ip_10_0_0_1.k");
}

/// A request's value (a descriptor limit's key too) longer than 64 bytes is spelled by a
/// short hash, the same everywhere; a rule whose key carries values has an overflow key.
#[test]
fn long_values_are_hashed_and_rules_of_request_values_have_an_overflow_key() {
    let tree = tree(
        "domain: d
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        value: GET
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
",
    );
    let long = "v".repeat(MAX_SPELLED_BYTES + 1);
    let edge = "v".repeat(MAX_SPELLED_BYTES);
    // sha256("v" x 65) starts 0e50f229ffa7efab.
    assert_eq!(
        stats_key(&tree, "d", &[("user", &long)]),
        "d.user_h_0e50f229ffa7efab"
    );
    assert_eq!(
        stats_key(&tree, "d", &[("user", &edge)]),
        format!("d.user_{edge}")
    );
    assert_eq!(
        stats_key(&tree, "d", &[("route", &long), ("method", "GET")]),
        "d.route_h_0e50f229ffa7efab.method_GET"
    );
    let overflow = |pairs: &[(&str, &str)]| {
        let found = tree.lookup("d", entries(pairs)).unwrap();
        let stats = &tree.rules[found.rule.unwrap()].stats;
        stats.overflow().map(str::to_string)
    };
    assert_eq!(
        overflow(&[("user", "u")]).as_deref(),
        Some("d.user.overflow")
    );
    assert_eq!(
        overflow(&[("route", "r"), ("method", "GET")]).as_deref(),
        Some("d.route.method_GET.overflow")
    );
    assert_eq!(overflow(&[("plain", "p")]), None);
    let mut own = String::new();
    request_limit_stats_key("d", entries(&[(&long, &long), ("k", "v")]), &mut own);
    assert_eq!(own, "d.h_0e50f229ffa7efab_h_0e50f229ffa7efab.k_v");
    request_limit_overflow_key("d", &mut own);
    assert_eq!(own, "d.overflow");
}

#[test]
fn limit_names_are_the_rules_own_else_the_path() {
    let (_, rules) = from_yaml("t.yaml", BASIC).unwrap();
    let mut taken = HashSet::new();
    let (_, limits) = ErlRules::compile(&rules, 0, &mut taken).unwrap();
    let names: Vec<&str> = limits.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "d-k",
            "d-k-v",
            "d-k-parent-sub",
            "d-w-foo-",
            "d-w-foobar",
            "d-m-a-b-c",
            "envoy-request-limit"
        ]
    );
}
