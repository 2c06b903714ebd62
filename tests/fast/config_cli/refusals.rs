//! Bad config values and shapes: each refused with exit code 2 and one line naming its key.

use super::*;

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

#[test]
fn a_coalescing_window_past_its_bounds_or_the_timeout_is_refused() {
    // The default timeout is 50 ms: a window must leave the check time for Redis.
    for window in ["101", "50"] {
        let toml = format!("[store]\ncoalesce_window_ms = {window}\n");
        let output = run(&["validate"], Some(&toml), &[]);
        assert_refused(&output, "store.coalesce_window_ms");
    }
    let output = run(
        &["validate"],
        Some("[store]\ncoalesce_window_ms = 2\n"),
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));
}
