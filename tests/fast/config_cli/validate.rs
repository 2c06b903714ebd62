//! `tollgate validate`: the effective limits it prints, the shipped examples it accepts and
//! the warnings it gives.

use super::*;

#[test]
fn validate_prints_the_effective_limits() {
    let config = format!(
        "[store]\nbackend = \"redis\"\nurl = \"redis://:hunter2@10.0.0.5:6379/0\"\n{LIMIT}\n[limits.match]\npath_prefix = \"/api/\"\n"
    );
    let output = run(&["validate"], Some(&config), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        out.contains("rate 1/s") && out.contains("burst 5") && out.contains("/api/"),
        "{out}"
    );
    assert!(out.contains("redis://:***@10.0.0.5:6379/0"), "{out}");
    assert!(!out.contains("hunter2"), "the password is never printed");
}

#[test]
fn the_shipped_example_config_is_valid() {
    let example = include_str!("../../../config/tollgate.toml");
    let output = run(&["validate"], Some(example), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        out.contains("limits        5") && out.contains("on_error allow"),
        "{out}"
    );
}

/// The image runs `config/tollgate.toml` as it is (`TOLLGATE_CONFIG`, the chart's
/// `mode=ratelimit`, `docker run`): no example key may be live in it, least of all one that
/// lifts a limit for whoever sends it.
#[test]
fn the_shipped_example_config_grants_no_example_key_anything() {
    let dir = TempDir::new("example");
    let path = dir.write(
        "tollgate.toml",
        include_str!("../../../config/tollgate.toml"),
    );
    let config = tollgate_core::config::Config::load(Some(&path)).expect("valid");
    for limit in &config.limits {
        assert!(
            limit.overrides.is_empty() && limit.overrides_file.is_none(),
            "{}: {:?}",
            limit.name,
            limit.overrides
        );
    }
}

#[test]
fn the_plans_example_of_the_readme_is_valid_and_warns_about_nothing() {
    let output = run(
        &["validate"],
        Some(include_str!("../../../config/plans.toml")),
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(out.contains("rate 60/min = 1 tokens/s"), "{out}");
    assert!(out.contains("overrides     enterprise: 1 key(s)"), "{out}");
    assert!(!out.contains("warning"), "{out}");
}

#[test]
fn validate_shows_written_rates_per_second_policies_and_warns_about_overlapping_tiers() {
    let dir = TempDir::new("validate-policies");
    dir.write(
        "keys.toml",
        "[[overrides]]\nkey = [\"x\"]\nburst = 9\n[[overrides]]\nkey = [\"y\"]\nunlimited = true\n",
    );
    let config = "[[exempt]]\nname = \"office\"\ncidrs = [\"10.0.0.0/8\"]\n\
        [[limits]]\nname = \"gold\"\nrate = \"1000/min\"\nburst = 200\nkey = [\"header:x-api-key\"]\n\
        [limits.match]\nheaders = { \"x-plan\" = [\"gold\"] }\n\
        [[limits]]\nname = \"free\"\nrate = \"10/min\"\nburst = 20\nkey = [\"header:x-api-key\"]\n\
        [limits.match]\nheaders = { \"x-plan\" = [\"free\", \"\"] }\n\
        [[limits]]\nname = \"any\"\nrate = 10\nburst = 20\nkey = [\"header:x-api-key\"]\n\
        overrides_file = \"keys.toml\"\n[[limits.overrides]]\nkey = [\"z\"]\nburst = 5\n";
    let path = dir.write("tollgate.toml", config);
    let output = tollgate_command()
        .args(["validate", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(out.contains("rate 1000/min = 16.666667 tokens/s"), "{out}");
    assert!(out.contains("rate 10/s"), "{out}");
    assert!(
        out.contains("office           cidrs [\"10.0.0.0/8\"]"),
        "{out}"
    );
    assert!(out.contains("overrides     any: 3 key(s)"), "{out}");
    let warnings: Vec<&str> = out.lines().filter(|l| l.starts_with("warning:")).collect();
    // gold and free exclude each other by their header values; "any" has no header rule.
    assert_eq!(warnings.len(), 2, "{out}");
    assert!(warnings[0].contains("limits.gold and limits.any"), "{out}");
    assert!(warnings[1].contains("limits.free and limits.any"), "{out}");
}

#[test]
fn the_extremes_the_store_can_represent_are_accepted() {
    let cases = [
        // Ten years to refill, just under the bound.
        &limit("a", "3.2e-9", 1, &["ip"]),
        "[[limits]]\nname = \"a\"\nrate = 3.2\nburst = 1000000000\ncost = 1000000000\nkey = [\"ip\"]\n",
        &limit("a", "1e300", 1, &["ip"]),
        "[response]\ndeny_status = 400\n[client_ip]\nipv6_prefix = 32\n",
        "[response]\ndeny_status = 499\n[client_ip]\nipv6_prefix = 128\n",
    ];
    for config in cases {
        let output = run(&["validate"], Some(config), &[]);
        assert!(output.status.success(), "{config}: {}", stderr(&output));
    }
}

/// Borrowing is on by default: `validate` says, per limit, where it is on and why it is off.
#[test]
fn validate_says_per_limit_where_borrowing_is_on_and_why_it_is_off() {
    let limits = [
        ("plain", "rate = 10\nburst = 20\n", "on"),
        (
            "daily",
            "quota = 10\nperiod = \"day\"\n",
            "off: borrowing applies only to a rate limit",
        ),
        (
            "pool",
            "concurrency = 3\n",
            "off: borrowing applies only to a rate limit",
        ),
        (
            "reported",
            "rate = 1\nburst = 5\ncharge = \"report\"\n",
            "off: borrowing does not apply to a charge = \"report\" limit",
        ),
        (
            "watched",
            "rate = 1\nburst = 5\nshadow = true\n",
            "off: borrowing does not apply to a shadow limit",
        ),
        (
            "heavy",
            "rate = 1\nburst = 5\ncost = 2\n",
            "off: borrowing applies only to a cost of one token per request",
        ),
        (
            "declined",
            "rate = 1\nburst = 5\nborrow = false\n",
            "off: limits.declined.borrow = false",
        ),
    ];
    let mut toml = String::from("[store]\nbackend = \"redis\"\n\n");
    for (name, body, _) in limits {
        toml.push_str(&format!(
            "[[limits]]\nname = \"{name}\"\nkey = [\"ip\"]\n{body}\n"
        ));
    }
    let output = run(&["validate"], Some(&toml), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    for (name, _, said) in limits {
        let line = format!("borrowing     {name}: {said}");
        assert!(printed.contains(&line), "{line:?} in\n{printed}");
    }

    let off = toml.replace(
        "backend = \"redis\"\n",
        "backend = \"redis\"\nborrow = false\n",
    );
    let output = run(&["validate"], Some(&off), &[]);
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        printed.contains("borrowing     plain: off: store.borrow = false"),
        "{printed}"
    );
    let memory = toml.replace("backend = \"redis\"\n", "backend = \"memory\"\n");
    let output = run(&["validate"], Some(&memory), &[]);
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        printed.contains("borrowing     plain: off: only the Redis store borrows"),
        "{printed}"
    );
}
