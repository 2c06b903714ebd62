use super::*;

fn refusal(yaml: &str) -> String {
    from_yaml("f.yaml", yaml).unwrap_err().reason
}

/// envoyproxy/ratelimit test/config: bad_limit_unit, duplicate_key, empty_key,
/// misspelled_key(2), non_map_list, non_string_key, replaces_empty, replaces_self,
/// unlimited_with_unit, empty_domain, and a share_threshold without a wildcard.
#[test]
fn what_envoyproxy_ratelimit_refuses_is_refused() {
    let node = |body: &str| format!("domain: d\ndescriptors:\n  - key: k\n{body}");
    assert!(refusal(&node(
        "    rate_limit: {unit: fortnight, requests_per_unit: 5}\n"
    ))
    .contains("invalid rate limit unit"));
    assert!(refusal(&node("    value: v\n  - key: k\n    value: v\n"))
        .contains("duplicate descriptor composite key"));
    assert!(refusal("domain: d\ndescriptors:\n  - value: v\n").contains("empty key"));
    assert!(
        refusal(&node("    ratelimit: {unit: day, requests_per_unit: 5}\n"))
            .contains("unknown key \"ratelimit\"")
    );
    assert!(
        refusal(&node("    rate_limit: {unit: day, requestsperunit: 5}\n"))
            .contains("unknown key \"requestsperunit\"")
    );
    assert!(refusal("domain: d\ndescriptors:\n  - a\n  - b\n").contains("other than map"));
    assert!(refusal("0.25: d\n").contains("not of type string"));
    assert!(refusal(&node(
        "    rate_limit: {name: me, unit: second, requests_per_unit: 1, replaces: [{name: }]}\n"
    ))
    .contains("empty replaces"));
    assert!(refusal(&node(
        "    rate_limit: {name: me, unit: second, requests_per_unit: 1, replaces: [{name: me}]}\n"
    ))
    .contains("name of same descriptor"));
    assert!(refusal(&node(
        "    rate_limit: {unlimited: true, unit: day, requests_per_unit: 25}\n"
    ))
    .contains("when unlimited"));
    assert!(refusal("domain: \"\"\n").contains("empty domain"));
    assert!(refusal(&node("    value: v\n    share_threshold: true\n")).contains("share_threshold"));
    assert!(refusal(&node(
        "    rate_limit: {unit: day, requests_per_unit: 1.5}\n"
    ))
    .contains("error checking config"));
}

#[test]
fn a_tree_becomes_its_nodes_in_file_order() {
    let yaml = "domain: d\ndescriptors:\n  - key: a\n    value: x\n    descriptors:\n      - key: b\n        rate_limit: {unit: MINUTE, requests_per_unit: 60, name: n}\n  - key: c\n    value: \"p*\"\n    share_threshold: true\n    rate_limit: {unlimited: true}\n    metadata: {anything: [1, 2.5]}\n";
    let (domain, rules) = from_yaml("f.yaml", yaml).unwrap();
    assert_eq!(domain, "d");
    let described: Vec<String> = rules.iter().map(RuleConfig::describe).collect();
    assert_eq!(described, ["d (a, x)", "d (a, x) (b, *)", "d (c, p*)"]);
    assert_eq!(rules[1].rate_limit.as_ref().unwrap().name, "n");
    assert!(rules[2].share_threshold);
    assert_eq!(unit("MINUTE"), Some((2, 60)));
    assert_eq!(unit("unknown"), None);
}
