//! The command line: `validate`, `--version`, and every refused configuration exiting 2 with
//! one line that names the offending key.

use std::process::Output;

use std::time::Duration;

use crate::support::limit;
use crate::support::{
    free_port, make_certificates, make_client_certificate, tollgate_command, wait_until,
    HttpClient, TempDir,
};

fn run(args: &[&str], config: Option<&str>, env: &[(&str, &str)]) -> Output {
    let dir = TempDir::new("cli");
    let mut command = tollgate_command();
    if let Some(config) = config {
        command
            .arg("--config")
            .arg(dir.write("tollgate.toml", config));
    }
    command
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run tollgate")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts exit code 2 and a single stderr line naming `key`.
fn assert_refused(output: &Output, key: &str) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains(key), "{key:?} named in: {err}");
}

const LIMIT: &str = "[[limits]]\nname = \"a\"\nrate = 1\nburst = 5\nkey = [\"ip\"]\n";

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
    let example = include_str!("../../config/tollgate.toml");
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
    let path = dir.write("tollgate.toml", include_str!("../../config/tollgate.toml"));
    let config = tollgate::config::Config::load(Some(&path)).expect("valid");
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
        Some(include_str!("../../config/plans.toml")),
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(out.contains("rate 60/min = 1 tokens/s"), "{out}");
    assert!(out.contains("overrides     enterprise: 1 key(s)"), "{out}");
    assert!(!out.contains("warning"), "{out}");
}

#[test]
fn with_no_file_the_defaults_apply() {
    let output = run(&["validate"], None, &[]);
    assert!(output.status.success());
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        out.contains("memory")
            && out.contains("per-ip")
            && out.contains("rate 20/s")
            && out.contains("burst 100"),
        "{out}"
    );
}

#[test]
fn the_config_path_may_come_from_the_environment() {
    let dir = TempDir::new("cli-env");
    let path = dir.write("t.toml", &limit("from-env-file", 1, 1, &["ip"]));
    let output = tollgate_command()
        .arg("validate")
        .env("TOLLGATE_CONFIG", &path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(String::from_utf8_lossy(&output.stdout).contains("from-env-file"));
}

#[test]
fn environment_variables_override_the_file() {
    let output = run(
        &["validate"],
        Some(LIMIT),
        &[
            ("TOLLGATE_STORE__TIMEOUT_MS", "75"),
            ("TOLLGATE_STORE__BACKEND", "redis"),
        ],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(String::from_utf8_lossy(&output.stdout).contains("timeout 75 ms"));
}

#[test]
fn kubernetes_service_variables_are_ignored() {
    let output = run(
        &["validate"],
        Some(LIMIT),
        &[
            ("TOLLGATE_SERVICE_HOST", "10.0.0.1"),
            ("TOLLGATE_SERVICE_PORT", "8080"),
            ("TOLLGATE_PORT", "tcp://10.0.0.1:8080"),
            ("TOLLGATE_PORT_8080_TCP_ADDR", "10.0.0.1"),
        ],
    );
    assert!(output.status.success(), "{}", stderr(&output));
}

/// The testing-only divisor of the background intervals (CONTRIBUTING.md): a valid one
/// changes nothing `validate` shows, a malformed one is refused as a bad key is; and the
/// intervals are no key of the file or the environment.
#[test]
fn the_test_timings_scale_is_refused_when_malformed_and_is_no_key() {
    const SCALE: &str = "TOLLGATE_TEST_TIMINGS_SCALE";
    let plain = run(&["validate"], Some(LIMIT), &[]);
    let scaled = run(&["validate"], Some(LIMIT), &[(SCALE, "10")]);
    assert!(scaled.status.success(), "{}", stderr(&scaled));
    assert_eq!(scaled.stdout, plain.stdout);
    for bad in ["0", "101", "ten", "2.5", "-1", ""] {
        for command in ["validate", "serve"] {
            let output = run(&[command], Some(LIMIT), &[(SCALE, bad)]);
            assert_refused(&output, SCALE);
            assert!(
                stderr(&output).contains("from 1 to 100"),
                "{}",
                stderr(&output)
            );
        }
    }
    let in_the_file = run(&["validate"], Some(&format!("timings = 1\n{LIMIT}")), &[]);
    assert_refused(&in_the_file, "timings: unknown key");
    let in_the_environment = run(&["validate"], Some(LIMIT), &[("TOLLGATE_TIMINGS", "1")]);
    assert_refused(&in_the_environment, "timings: unknown key");
}

#[test]
fn every_invalid_value_is_refused_naming_its_key() {
    let cases: &[(&str, &str)] = &[
        ("bogus = 1\n", "bogus"),
        ("[store]\ntimeout = 5\n", "store.timeout"),
        ("[store]\nbackend = \"mongo\"\n", "store.backend"),
        ("[store]\ntimeout_ms = 0\n", "store.timeout_ms"),
        ("[store]\noverride_poll_ms = 5\n", "store.override_poll_ms"),
        ("[store]\non_error = \"maybe\"\n", "store.on_error"),
        ("[store]\nbackend = \"redis\"\nurl = \"http://x\"\n", "store.url"),
        ("[store]\nkey_prefix = \"\"\n", "store.key_prefix"),
        ("listen = \"nowhere\"\n", "listen"),
        ("admin_hosts = [\"ok.svc\", \"evil.example:9090\"]\n", "admin_hosts[1]"),
        ("admin_hosts = [\"\"]\n", "admin_hosts[0]"),
        ("grpc_max_connections = 0\n", "grpc_max_connections"),
        ("grpc_max_connections = -1\n", "grpc_max_connections"),
        ("[client_ip]\ntrusted_proxies = [\"10.0.0.0/33\"]\n", "client_ip.trusted_proxies"),
        ("[client_ip]\nfrom = \"cookie\"\n", "client_ip.from"),
        ("[response]\ndeny_status = 42\n", "response.deny_status"),
        ("[response]\nheaders = [\"draft-7\"]\n", "response.headers"),
        // A proxy admits a 2xx/3xx auth answer and treats a 5xx as its own failure.
        ("[response]\ndeny_status = 200\n", "response.deny_status"),
        ("[response]\ndeny_status = 302\n", "response.deny_status"),
        ("[response]\ndeny_status = 503\n", "response.deny_status"),
        ("[client_ip]\nipv6_prefix = 0\n", "client_ip.ipv6_prefix"),
        ("[client_ip]\nipv6_prefix = 31\n", "client_ip.ipv6_prefix"),
        ("[client_ip]\nipv6_prefix = 129\n", "client_ip.ipv6_prefix"),
        ("[client_ip]\nipv6_prefix = 300\n", "client_ip.ipv6_prefix"),
        (&limit("a", 0, 5, &["ip"]), "limits.a.rate"),
        (&limit("a", -1, 5, &["ip"]), "limits.a.rate"),
        (&limit("a", 1, 0, &["ip"]), "limits.a.burst"),
        // Buckets the store cannot represent: the refill time overflows what PEXPIRE takes
        // (or is infinite), or the burst leaves the range of exact float integers.
        (&limit("a", "1e-14", 5, &["ip"]), "limits.a.rate"),
        (&limit("a", "1e-300", 5, &["ip"]), "limits.a.rate"),
        (&limit("a", "3.1e-9", 1, &["ip"]), "limits.a.rate"),
        (&limit("a", 3, 1000000000, &["ip"]), "limits.a.rate"),
        (&limit("a", "inf", 5, &["ip"]), "limits.a.rate"),
        (&limit("a", "nan", 5, &["ip"]), "limits.a.rate"),
        (&limit("a", "1e9", 1000000001, &["ip"]), "limits.a.burst"),
        (&limit("a", "1e9", 9_007_199_254_740_993_u64, &["ip"]), "limits.a.burst"),
        ("[[limits]]\nname = \"a\"\nrate = 1\nburst = 5\ncost = 6\nkey = [\"ip\"]\n", "limits.a.cost"),
        (&limit("a", 1, 5, &["cookie"]), "limits.a.key[0]"),
        (&limit("a", 1, 5, &[]), "limits.a.key"),
        ("[[limits]]\nname = \"Bad Name\"\nrate = 1\nburst = 5\nkey = [\"ip\"]\n", "limits.name: \"Bad Name\""),
        ("[[limits]]\nname = \"a\"\nrate = 1\nburst = 5\nkey = [\"ip\"]\n[limits.match]\npath_prefix = \"api\"\n", "limits.a.match.path_prefix"),
        (&limit("a", 1, 5, &["ip"]).set("window", 3), "window"),
        (&"[[limits]]
name = \"a\"
rate = 1
burst = 5
key = [\"ip\"]
".repeat(2), "limits.a.name"),
        ("[[limits]]
name = \"a\"
rate = 1
key = [\"ip\"]
", "limits.a.burst"),
        ("[[limits]]
name = \"a\"
burst = 1
key = [\"ip\"]
", "limits.a.rate"),
        ("[store\n", "TOML"),
    ];
    for (config, key) in cases {
        let output = run(&["validate"], Some(config), &[]);
        assert_refused(&output, key);
    }
}

const PER_KEY: &str =
    "[[limits]]\nname = \"k\"\nrate = 1\nburst = 5\nkey = [\"header:x-api-key\"]\n";

#[test]
fn every_invalid_policy_shape_is_refused_naming_its_key() {
    let cases: &[(String, &str)] = &[
        (
            "[[limits]]\nname = \"a\"\nrate = \"5/fortnight\"\nburst = 5\nkey = [\"ip\"]\n".into(),
            "limits.a.rate: \"5/fortnight\": unknown unit",
        ),
        (
            "[[limits]]\nname = \"a\"\nrate = \"0/min\"\nburst = 5\nkey = [\"ip\"]\n".into(),
            "limits.a.rate",
        ),
        (
            format!("{PER_KEY}[limits.match]\nheader = {{ \"x-plan\" = [\"gold\"] }}\n"),
            "limits.0.match.header: unknown key",
        ),
        (
            "[[exempt]]\nname = \"office\"\ncidr = [\"10.0.0.0/8\"]\n".into(),
            "exempt.0.cidr: unknown key",
        ),
        (
            "[[exempt]]\nname = \"a\"\ncidrs = [\"10.0.0.0/8\"]\n[[exempt]]\nname = \"a\"\nmethods = [\"GET\"]\n".into(),
            "exempt.a.name: duplicate",
        ),
        ("[[exempt]]\nname = \"all\"\n".into(), "exempt.all: has no condition"),
        (
            "[[exempt]]\nname = \"a\"\ncidrs = [\"10.0.0.0/33\"]\n".into(),
            "exempt.0.cidrs",
        ),
        (
            format!("{PER_KEY}[[limits.overrides]]\nkey = [\"a\", \"b\"]\nburst = 9\n"),
            "limits.k.overrides[0].key: has 2 value(s)",
        ),
        (
            format!("{PER_KEY}[[limits.overrides]]\nkey = [\"a\"]\nunlimited = true\nrate = 5\n"),
            "limits.k.overrides[0].unlimited: cannot be combined with rate",
        ),
        (
            format!("{PER_KEY}[[limits.overrides]]\nkey = [\"a\"]\nburst = 9\nwindow = 3\n"),
            "limits.0.overrides.0.window: unknown key",
        ),
        (
            format!("{PER_KEY}[[limits.overrides]]\nkey = [\"a\"]\nrate = \"9/week\"\n"),
            "limits.k.overrides[0].rate",
        ),
        (
            format!("{PER_KEY}overrides_file = \"/nonexistent/keys.toml\"\n"),
            "limits.k.overrides_file: cannot read /nonexistent/keys.toml",
        ),
    ];
    for (config, key) in cases {
        let output = run(&["validate"], Some(config), &[]);
        assert_refused(&output, key);
    }
}

#[test]
fn every_malformed_concurrency_limit_is_refused_naming_its_key() {
    const HEAD: &str = "[[limits]]\nname = \"c\"\nkey = [\"ip\"]\n";
    let cases: &[(&str, &str)] = &[
        (
            "concurrency = 0\n",
            "limits.c.concurrency: must be between 1",
        ),
        ("concurrency = 1000000001\n", "limits.c.concurrency"),
        (
            "concurrency = 2\nrate = 1\n",
            "limits.c.rate: a concurrency limit takes",
        ),
        (
            "concurrency = 2\nburst = 5\n",
            "limits.c.burst: a concurrency limit takes",
        ),
        (
            "concurrency = 2\nquota = 5\nperiod = \"day\"\n",
            "limits.c.quota",
        ),
        ("concurrency = 2\ncharge = \"report\"\n", "limits.c.charge"),
        ("concurrency = 2\ncost = 2\n", "limits.c.cost"),
        (
            "concurrency = 2\ncost_header = \"x-cost\"\n",
            "limits.c.cost_header",
        ),
        (
            "concurrency = 2\nlease_ttl_s = 0\n",
            "limits.c.lease_ttl_s: must be between 1",
        ),
        (
            "concurrency = 2\nlease_ttl_s = 86401\n",
            "limits.c.lease_ttl_s",
        ),
        (
            "rate = 1\nburst = 5\nlease_ttl_s = 5\n",
            "limits.c.lease_ttl_s: applies only",
        ),
        ("concurrency = -1\n", "concurrency"),
        (
            "concurrency = 2\n[[limits.overrides]]\nkey = [\"10.0.0.1\"]\nunlimited = true\n",
            "limits.c.overrides",
        ),
    ];
    for (rest, key) in cases {
        let config = format!("{HEAD}{rest}");
        let output = run(&["validate"], Some(&config), &[]);
        assert_refused(&output, key);
    }
    let fine = format!("{HEAD}concurrency = 3\nlease_ttl_s = 30\n");
    let output = run(&["validate"], Some(&fine), &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(
        shown.contains("concurrency 3  lease_ttl_s 30"),
        "validate shows the limit: {shown}"
    );
}

#[test]
fn every_malformed_reserving_limit_is_refused_naming_its_key() {
    const HEAD: &str = "[[limits]]\nname = \"r\"\nkey = [\"ip\"]\nrate = 1\nburst = 50\n";
    const REPORT: &str = "charge = \"report\"\n";
    let cases: &[(&str, &str)] = &[
        (
            "reserve = 5\n",
            "limits.r.reserve: applies only with charge = \"report\"",
        ),
        (
            "reserve_header = \"x-estimate\"\n",
            "limits.r.reserve_header: applies only with charge",
        ),
        (
            "charge = \"report\"\nreserve = 0\n",
            "limits.r.reserve: must be between 1 and the burst",
        ),
        (
            "charge = \"report\"\nreserve = 51\n",
            "limits.r.reserve: must be between 1 and the burst (50)",
        ),
        ("charge = \"report\"\nreserve = -1\n", "reserve"),
        ("charge = \"report\"\nreserve = \"ten\"\n", "reserve"),
        (
            "charge = \"report\"\nreserve_header = \"x estimate\"\n",
            "limits.r.reserve_header: is not a valid header name",
        ),
        (
            "charge = \"report\"\nreserve = 5\nreservation_ttl_s = 0\n",
            "limits.r.reservation_ttl_s: must be between 1",
        ),
        (
            "charge = \"report\"\nreserve = 5\nreservation_ttl_s = 86401\n",
            "limits.r.reservation_ttl_s",
        ),
        (
            "charge = \"report\"\nreservation_ttl_s = 60\n",
            "limits.r.reservation_ttl_s: applies only to a reserving limit",
        ),
        (
            "charge = \"report\"\non_reservation_expiry = \"refund\"\n",
            "limits.r.on_reservation_expiry: applies only to a reserving limit",
        ),
        (
            "charge = \"report\"\nreserve = 5\non_reservation_expiry = \"forget\"\n",
            "on_reservation_expiry",
        ),
    ];
    for (rest, key) in cases {
        let config = format!("{HEAD}{rest}");
        let output = run(&["validate"], Some(&config), &[]);
        assert_refused(&output, key);
    }
    let quota = format!(
        "[[limits]]\nname = \"r\"\nkey = [\"ip\"]\nquota = 5\nperiod = \"day\"\n{REPORT}reserve = 1\n"
    );
    assert_refused(
        &run(&["validate"], Some(&quota), &[]),
        "limits.r.reserve: applies to token buckets",
    );
    let grpc = format!("{HEAD}{REPORT}reserve = 5\n").replace("\"ip\"", "\"descriptor:user\"");
    assert_refused(&run(&["validate"], Some(&grpc), &[]), "limits.r.reserve");
    let fine = format!(
        "{HEAD}{REPORT}reserve = 5\nreserve_header = \"x-estimate\"\nreservation_ttl_s = 30\non_reservation_expiry = \"refund\"\n"
    );
    let output = run(&["validate"], Some(&fine), &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(
        shown.contains("reserves 5 or x-estimate for 30 s, then refunds it"),
        "validate shows the limit: {shown}"
    );
}

#[test]
fn a_broken_overrides_file_is_refused_naming_the_file_and_entry() {
    let dir = TempDir::new("overrides-file");
    let file = dir.write(
        "keys.toml",
        "[[overrides]]\nkey = [\"a\"]\nburst = 9\n[[overrides]]\nkey = [\"b\"]\nunlimited = true\nburst = 3\n",
    );
    let config = format!("{PER_KEY}overrides_file = \"{}\"\n", file.display());
    assert_refused(
        &run(&["validate"], Some(&config), &[]),
        "limits.k.overrides_file",
    );
    assert!(stderr(&run(&["validate"], Some(&config), &[])).contains("overrides[1].unlimited"));
    dir.write(
        "keys.toml",
        "[[overrides]]\nkey = [\"a\"]\nburst = 9\nfoo = 1\n",
    );
    let output = run(&[], Some(&config), &[]);
    assert_refused(&output, "limits.k.overrides_file");
    assert!(
        stderr(&output).contains("line 4: unknown field `foo`"),
        "{}",
        stderr(&output)
    );
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

#[test]
fn serve_refuses_a_bad_config_with_exit_code_2() {
    let output = run(&[], Some("[store]\ntimeout_ms = 0\n"), &[]);
    assert_refused(&output, "store.timeout_ms");
    let output = run(
        &["serve"],
        Some(LIMIT),
        &[("TOLLGATE_STORE__ON_ERROR", "sometimes")],
    );
    assert_refused(&output, "store.on_error");
    // Refused before binding: the listen port taken changes nothing.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    let listen = taken.local_addr().expect("bound").to_string();
    let output = run(
        &["serve"],
        Some("[[exempt]]\nname = \"x\"\n"),
        &[("TOLLGATE_LISTEN", &listen)],
    );
    assert_refused(&output, "exempt.x");
}

#[test]
fn a_missing_config_file_is_refused() {
    let output = tollgate_command()
        .args(["validate", "--config", "/nonexistent/tollgate.toml"])
        .output()
        .unwrap();
    assert_refused(&output, "--config");
}

#[test]
fn version_and_help() {
    let output = tollgate_command().arg("--version").output().unwrap();
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        format!("tollgate {}", env!("CARGO_PKG_VERSION"))
    );
    let output = tollgate_command().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && help.contains("validate") && help.contains("--config"));
}

/// envoyproxy/ratelimit's xDS source: a bad variable, a missing TLS file, a bad `[envoy] xds`
/// key, and `config_dir` with `xds`, each refused
/// before serving with one line naming it.
#[test]
fn bad_xds_settings_are_refused_naming_the_key() {
    let erl = |extra: &[(&'static str, &'static str)]| {
        let mut env = vec![
            ("RUNTIME_ROOT", "/nonexistent"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ];
        env.extend_from_slice(extra);
        run(&["validate"], None, &env)
    };
    for (key, value) in [
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3 seconds"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "yes"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "grpc://xds"),
    ] {
        assert_refused(&erl(&[(key, value)]), key);
    }
    let missing_ca = erl(&[
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/nonexistent/ca.pem"),
    ]);
    assert_refused(&missing_ca, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT");
    let output = run(
        &["serve"],
        None,
        &[("RUNTIME_ROOT", "/d"), ("CONFIG_TYPE", "REST")],
    );
    assert_refused(&output, "CONFIG_TYPE");
    let output = run(
        &["validate"],
        Some("[envoy]\nxds = { server = \"xds\" }\n"),
        &[],
    );
    assert_refused(&output, "envoy.xds.server");
    let output = run(&["validate"], Some("[envoy.xds]\nnode = \"n\"\n"), &[]);
    assert_refused(&output, "envoy.xds.node");
    let both = "[envoy]\nconfig_dir = \"rules\"\nxds = { server = \"xds:18000\" }\n";
    assert_refused(&run(&["validate"], Some(both), &[]), "envoy.xds");
    let fine = "[envoy]\nxds = { server = \"xds:18000\", node_id = \"n\", retry_ms = 500 }\n";
    let output = run(&["validate"], Some(fine), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("xDS server xds:18000"), "{printed}");
}

/// `grpc_tls`: a missing, malformed or mismatched file, a subject name without a client CA, TLS
/// without a gRPC listener; each refused with one line naming the key.
#[test]
fn bad_grpc_tls_settings_are_refused_naming_the_key() {
    let certs = TempDir::new("grpc-tls");
    make_certificates(certs.path());
    make_client_certificate(certs.path(), "other", "DNS:other.example");
    let garbage = certs.write("garbage.pem", "not PEM at all\n");
    let dir = certs.path().display();
    let tls = |fields: &str| {
        format!(
            "grpc_listen = \"127.0.0.1:0\"\ngrpc_tls = {{ cert_file = \"{dir}/cert.pem\", key_file = \"{dir}/key.pem\"{fields} }}\n"
        )
    };
    let garbage = garbage.display();
    for (config, key) in [
        (
            format!("grpc_listen = \"127.0.0.1:0\"\ngrpc_tls = {{ cert_file = \"{dir}/none.pem\", key_file = \"{dir}/key.pem\" }}\n"),
            "grpc_tls.cert_file",
        ),
        (
            format!("grpc_listen = \"127.0.0.1:0\"\ngrpc_tls = {{ cert_file = \"{garbage}\", key_file = \"{dir}/key.pem\" }}\n"),
            "grpc_tls.cert_file",
        ),
        (
            format!("grpc_listen = \"127.0.0.1:0\"\ngrpc_tls = {{ cert_file = \"{dir}/cert.pem\", key_file = \"{garbage}\" }}\n"),
            "grpc_tls.key_file",
        ),
        // The key of another certificate.
        (
            format!("grpc_listen = \"127.0.0.1:0\"\ngrpc_tls = {{ cert_file = \"{dir}/cert.pem\", key_file = \"{dir}/other.key\" }}\n"),
            "grpc_tls.key_file",
        ),
        (tls(&format!(", client_ca_file = \"{garbage}\"")), "grpc_tls.client_ca_file"),
        (tls(", client_san = \"envoy.example\""), "grpc_tls.client_san"),
        (
            tls(&format!(", client_ca_file = \"{dir}/ca.pem\", client_san = \"a b\"")),
            "grpc_tls.client_san",
        ),
        (tls(", cert = \"x\""), "grpc_tls.cert"),
        (
            format!("grpc_tls = {{ cert_file = \"{dir}/cert.pem\", key_file = \"{dir}/key.pem\" }}\n"),
            "grpc_tls",
        ),
    ] {
        assert_refused(&run(&["validate"], Some(&config), &[]), key);
    }
    let output = run(
        &["validate"],
        Some(&tls(&format!(
            ", client_ca_file = \"{dir}/ca.pem\", client_san = \"envoy.example\""
        ))),
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains("clients with a certificate for envoy.example"),
        "{printed}"
    );
}

/// `store.tls`: without a `rediss://` URL (Sentinel's included), with a missing or malformed
/// file, half an identity, the key of another certificate, no file at all; each refused with
/// one line naming the key. A good one validates.
#[test]
fn bad_store_tls_settings_are_refused_naming_the_key() {
    let certs = TempDir::new("store-tls");
    make_certificates(certs.path());
    make_client_certificate(certs.path(), "other", "DNS:other.example");
    let garbage = certs.write("garbage.pem", "not PEM at all\n");
    let dir = certs.path().display();
    let garbage = garbage.display();
    let store = |url: &str, tls: &str| {
        format!("[store]\nbackend = \"redis\"\nurl = \"{url}\"\ntls = {{ {tls} }}\n")
    };
    let tls = |fields: &str| store("rediss://127.0.0.1:6380/0", fields);
    let identity = format!("cert_file = \"{dir}/cert.pem\", key_file = \"{dir}/key.pem\"");
    for (config, key) in [
        (store("redis://127.0.0.1:6379/0", &identity), "store.tls"),
        (
            tls(&format!("ca_file = \"{dir}/none.pem\"")),
            "store.tls.ca_file",
        ),
        (
            tls(&format!("ca_file = \"{garbage}\"")),
            "store.tls.ca_file",
        ),
        (
            tls(&format!("cert_file = \"{dir}/cert.pem\"")),
            "store.tls.key_file",
        ),
        (
            tls(&format!("key_file = \"{dir}/key.pem\"")),
            "store.tls.cert_file",
        ),
        (
            tls(&format!(
                "cert_file = \"{dir}/cert.pem\", key_file = \"{dir}/other.key\""
            )),
            "store.tls.key_file",
        ),
        (tls(""), "store.tls"),
        (tls("ca = \"x\""), "store.tls.ca"),
        (
            format!(
                "{}sentinel = {{ master = \"m\", urls = [\"redis://127.0.0.1:26379\"] }}\n",
                store("redis://127.0.0.1:6379/0", &identity)
            ),
            "store.tls",
        ),
    ] {
        assert_refused(&run(&["validate"], Some(&config), &[]), key);
    }
    let good = tls(&format!("ca_file = \"{dir}/ca.pem\", {identity}"));
    let output = run(&["validate"], Some(&good), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains(&format!(
            "node: TLS, CA {dir}/ca.pem, client certificate {dir}/cert.pem, no password"
        )),
        "{printed}"
    );
}

/// envoyproxy/ratelimit's `GRPC_SERVER_USE_TLS` and its files: refused naming the variable when
/// a file is missing or bad, and mapped onto `grpc_tls` when they are good.
#[test]
fn envoyproxy_ratelimit_grpc_tls_variables_set_grpc_tls() {
    let certs = TempDir::new("grpc-tls");
    make_certificates(certs.path());
    let rules = TempDir::new("rules");
    let path = |name: &str| certs.path().join(name).display().to_string();
    let (cert, key, ca) = (path("cert.pem"), path("key.pem"), path("ca.pem"));
    let root = rules.path().display().to_string();
    let erl = |extra: &[(&str, &str)]| {
        let mut env = vec![
            ("RUNTIME_ROOT", root.as_str()),
            ("RUNTIME_SUBDIRECTORY", ""),
            ("RUNTIME_APPDIRECTORY", ""),
            ("REDIS_URL", "/run/redis.sock"),
        ];
        env.extend_from_slice(extra);
        run(&["validate"], None, &env)
    };
    let tls = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", cert.as_str()),
        ("GRPC_SERVER_TLS_KEY", key.as_str()),
    ];
    for (extra, named) in [
        (vec![("GRPC_SERVER_USE_TLS", "yes")], "GRPC_SERVER_USE_TLS"),
        (
            vec![("GRPC_SERVER_USE_TLS", "true")],
            "GRPC_SERVER_TLS_CERT",
        ),
        (
            vec![
                tls[0],
                tls[1],
                ("GRPC_SERVER_TLS_KEY", "/nonexistent/key.pem"),
            ],
            "GRPC_SERVER_TLS_KEY",
        ),
        (
            vec![
                tls[0],
                tls[1],
                tls[2],
                ("GRPC_CLIENT_TLS_CACERT", "/nonexistent/ca.pem"),
            ],
            "GRPC_CLIENT_TLS_CACERT",
        ),
        (
            vec![
                tls[0],
                tls[1],
                tls[2],
                ("GRPC_CLIENT_TLS_SAN", "envoy.example"),
            ],
            "GRPC_CLIENT_TLS_SAN",
        ),
    ] {
        assert_refused(&erl(&extra), named);
    }
    // Without GRPC_SERVER_USE_TLS the files are not read, as there.
    let output = erl(&[("GRPC_SERVER_TLS_CERT", "/nonexistent/cert.pem")]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!String::from_utf8_lossy(&output.stdout).contains("grpc_tls"));
    let output = erl(&[
        tls[0],
        tls[1],
        tls[2],
        ("GRPC_CLIENT_TLS_CACERT", ca.as_str()),
        ("GRPC_CLIENT_TLS_SAN", "envoy.example"),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains(&format!(
            "grpc_tls      {cert}, clients with a certificate for envoy.example"
        )),
        "{printed}"
    );
}

/// Environment variables as a test sets them.
type Variables<'a> = Vec<(&'a str, String)>;

/// envoyproxy/ratelimit's `REDIS_*` variables, each set as it is deployed, through `validate`:
/// what each connection really uses (TLS and its CA, password or none; never the password
/// itself), or the refusal naming the variable. `REDIS_AUTH` and `REDIS_TLS` are the data
/// connection's (with Sentinel, the master's), `REDIS_SENTINEL_AUTH` the sentinels'.
#[test]
fn erl_redis_variables_give_each_connection_what_envoyproxy_ratelimit_gives_it() {
    let certs = TempDir::new("erl-redis-tls");
    make_certificates(certs.path());
    let ca = certs.path().join("ca.pem").display().to_string();
    let rules = TempDir::new("erl-redis-rules");
    let root = rules.path().display().to_string();
    let sentinel = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", "mymaster,127.0.0.1:26379"),
    ];
    let tcp = [
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "127.0.0.1:6380"),
    ];
    let with = |base: &[(&'static str, &'static str)], extra: &[(&'static str, &str)]| {
        let mut env: Vec<(&str, String)> = base.iter().map(|(k, v)| (*k, v.to_string())).collect();
        env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        env
    };
    let ca_env = [("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", ca.as_str())];
    let both_tls = format!(
        "master: TLS, CA {ca}, client certificate none, no password; sentinels: TLS, CA {ca}, \
         client certificate none, no password"
    );
    #[rustfmt::skip]
    let table: Vec<(Variables<'_>, Result<&str, &str>)> = vec![
        // The password is the master's, not the sentinels'.
        (with(&sentinel, &[("REDIS_AUTH", "masterpw")]),
         Ok("via [redis://127.0.0.1:26379] (timeout 50 ms, on_error error, prefix \"tollgate\", \
             deny cache on, borrow on (100 to 10000 ms); master: plaintext, password set; sentinels: plaintext, no password)")),
        (with(&sentinel, &[("REDIS_AUTH", "masterpw"), ("REDIS_SENTINEL_AUTH", "sentpw")]),
         Ok("via [redis://:***@127.0.0.1:26379] (timeout 50 ms, on_error error, prefix \
             \"tollgate\", deny cache on, borrow on (100 to 10000 ms); master: plaintext, password set; sentinels: \
             plaintext, password set)")),
        // A store failure is the error envoyproxy/ratelimit answers, unless told otherwise.
        (with(&tcp, &[("TOLLGATE_STORE__ON_ERROR", "allow")]),
         Ok("on_error allow")),
        // TLS and its CA go to the master and to the sentinels.
        (with(&sentinel, &ca_env),
         Ok("via [rediss://127.0.0.1:26379]")),
        (with(&sentinel, &ca_env),
         Ok(both_tls.as_str())),
        (with(&tcp, &[("REDIS_AUTH", "pw"), ("REDIS_TLS", "True")]),
         Ok("redis rediss://:***@127.0.0.1:6380 (timeout 50 ms, on_error error, prefix \
             \"tollgate\", deny cache on, borrow on (100 to 10000 ms); node: TLS, CA the system's, client certificate none, \
             password set)")),
        (with(&[("REDIS_TYPE", "CLUSTER"), ("REDIS_URL", "10.0.0.1:7000,10.0.0.2:7001")],
              &[("REDIS_AUTH", "app:pw")]),
         Ok("cluster [redis://app:***@10.0.0.1:7000, redis://app:***@10.0.0.2:7001]")),
        (with(&[("REDIS_URL", "/var/run/redis.sock")], &[("REDIS_AUTH", "pw")]),
         Ok("redis redis+unix:///var/run/redis.sock?pass=*** (timeout 50 ms, on_error error, \
             prefix \"tollgate\", deny cache on, borrow on (100 to 10000 ms); node: plaintext, password set)")),
        // Refused, naming the variable: never the memory store, nor another meaning.
        (with(&[], &[]), Err("REDIS_URL")),
        (with(&[("REDIS_URL", "127.0.0.1:6380")], &[]), Err("REDIS_SOCKET_TYPE")),
        (with(&tcp, &[("REDIS_TLS", "yes")]), Err("REDIS_TLS")),
        (with(&tcp, &[("REDIS_TLS", "")]), Err("REDIS_TLS")),
        (with(&tcp, &[("REDIS_PERSECOND", "true")]), Err("REDIS_PERSECOND")),
        (with(&tcp, &[("REDIS_TYPE", "replicated")]), Err("REDIS_TYPE")),
        (with(&[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "mymaster")], &[]), Err("REDIS_URL")),
        (with(&[("REDIS_URL", "/s.sock")], &[("REDIS_TLS", "true")]), Err("REDIS_TLS")),
        // The rest of its environment, each as it reads it.
        (with(&tcp, &[("REDIS_TIMEOUT", "1.5s")]), Ok("(timeout 1500 ms,")),
        (with(&tcp, &[("REDIS_TIMEOUT", "0")]), Err("REDIS_TIMEOUT")),
        (with(&tcp, &[("BACKEND_TYPE", "")]), Ok("redis redis://127.0.0.1:6380 ")),
        (with(&tcp, &[("BACKEND_TYPE", "REDIS")]), Err("BACKEND_TYPE")),
        (with(&tcp, &[("CONFIG_TYPE", "file")]), Err("CONFIG_TYPE")),
        (with(&tcp, &[("GRPC_UDS", "/tmp/rl.sock")]), Err("GRPC_UDS")),
        (with(&tcp, &[("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true")]),
         Err("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")),
        (with(&tcp, &[("SHADOW_MODE", "on")]), Err("SHADOW_MODE")),
        (with(&tcp, &[("PORT", "010")]), Err("PORT")),
        (with(&tcp, &[("HOST", "")]), Err("HOST")),
        (with(&tcp, &[("GRPC_HOST", "rl.example")]), Err("GRPC_HOST")),
        (with(&tcp, &[("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                      ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "yes")]),
         Err("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")),
    ];
    for (variables, expected) in table {
        let mut env = vec![
            ("RUNTIME_ROOT", root.clone()),
            ("RUNTIME_SUBDIRECTORY", String::new()),
            ("RUNTIME_APPDIRECTORY", String::new()),
        ];
        env.extend(variables.iter().cloned());
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let output = run(&["validate"], None, &env);
        match expected {
            Ok(shown) => {
                assert!(output.status.success(), "{env:?}: {}", stderr(&output));
                let printed = String::from_utf8_lossy(&output.stdout);
                let store = printed
                    .lines()
                    .find(|l| l.starts_with("store "))
                    .unwrap_or("");
                assert!(store.contains(shown), "{env:?}:\n{store}\nlacks\n{shown}");
                for (_, value) in &variables {
                    if value.contains("pw") {
                        assert!(!printed.contains(value.as_str()), "{value} printed");
                    }
                }
            }
            Err(key) => assert_refused(&output, key),
        }
    }
}

/// The same in TOML: TLS asked for on the sentinels' side (`rediss://` sentinels, `store.tls`)
/// with a master left in clear is refused unless `master_tls = false` says it; the summary
/// then says what each side uses.
#[test]
fn a_sentinel_config_cannot_claim_tls_while_the_master_is_in_clear() {
    let certs = TempDir::new("sentinel-tls");
    make_certificates(certs.path());
    let ca = certs.path().join("ca.pem").display().to_string();
    let config = |sentinel_extra: &str| {
        format!(
            "[store]\nbackend = \"redis\"\ntls = {{ ca_file = \"{ca}\" }}\n\
             sentinel = {{ master = \"m\", urls = [\"rediss://127.0.0.1:26394\"]{sentinel_extra} }}\n"
        )
    };
    assert_refused(
        &run(&["validate"], Some(&config("")), &[]),
        "store.sentinel.master_tls",
    );
    let output = run(
        &["validate"],
        Some(&config(
            ", master_tls = true, master_password = \"masterpw\"",
        )),
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains(&format!(
            "master: TLS, CA {ca}, client certificate none, password set; sentinels: TLS, \
             CA {ca}, client certificate none, no password"
        )),
        "{printed}"
    );
    assert!(!printed.contains("masterpw"), "{printed}");
    let output = run(&["validate"], Some(&config(", master_tls = false")), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("master: plaintext, no password"),
        "said outright"
    );
}

/// Envoy Gateway runs envoyproxy/ratelimit's image as `/bin/ratelimit` with no arguments: the
/// binary under that name (a link, as in the image) serves, as `tollgate serve` does.
#[test]
fn started_as_ratelimit_without_a_subcommand_it_serves() {
    let dir = TempDir::new("ratelimit-argv0");
    let link = dir.path().join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tollgate"), &link).expect("link");
    let (listen, admin) = (free_port(), free_port());
    let config = dir.write(
        "tollgate.toml",
        &format!("listen = \"127.0.0.1:{listen}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n"),
    );
    let mut command = std::process::Command::new(&link);
    for (key, _) in std::env::vars().filter(|(key, _)| key.starts_with("TOLLGATE_")) {
        command.env_remove(key);
    }
    let mut child = command
        .env("TOLLGATE_CONFIG", &config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start ratelimit");
    let addr: std::net::SocketAddr = format!("127.0.0.1:{listen}").parse().unwrap();
    let checked = wait_until(Duration::from_secs(10), || {
        HttpClient::connect(addr)
            .and_then(|mut http| http.get("/check", &[]))
            .is_ok_and(|answer| answer.status == 200 && answer.header("ratelimit").is_some())
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(checked, "/check decided by the default limit");
}

#[test]
fn borrowing_is_refused_where_it_cannot_be_exact_this_round_naming_the_limit() {
    let base = "[[limits]]\nname = \"b\"\nkey = [\"ip\"]\nborrow = true\n";
    for (extra, why) in [
        ("quota = 10\nperiod = \"day\"\n", "quota"),
        ("concurrency = 3\n", "concurrency"),
        ("rate = 1\nburst = 5\ncharge = \"report\"\n", "report"),
        ("rate = 1\nburst = 5\nshadow = true\n", "shadow"),
        ("rate = 1\nburst = 5\ncost = 2\n", "cost"),
        (
            "rate = 1\nburst = 5\ncost_header = \"x-cost\"\n",
            "cost_header",
        ),
    ] {
        let output = run(&["validate"], Some(&format!("{base}{extra}")), &[]);
        assert_refused(&output, "limits.b.borrow");
        assert!(stderr(&output).contains(why), "{why}: {}", stderr(&output));
    }
    let output = run(&["validate"], Some("[store]\nborrow_horizon_ms = 5\n"), &[]);
    assert_refused(&output, "store.borrow_horizon_ms");
    for longest in ["50", "60001"] {
        let toml =
            format!("[store]\nborrow_horizon_ms = 100\nborrow_longest_horizon_ms = {longest}\n");
        let output = run(&["validate"], Some(&toml), &[]);
        assert_refused(&output, "store.borrow_longest_horizon_ms");
    }
    let fine = format!("{base}rate = 1\nburst = 5\n");
    let output = run(&["validate"], Some(&fine), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
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
