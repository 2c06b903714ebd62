//! The command line: `validate`, `--version`, and every refused configuration exiting 2 with
//! one line that names the offending key.

mod support;

use std::process::Output;

use support::{tollgate_command, TempDir};

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
    let example = include_str!("../config/tollgate.toml");
    let output = run(&["validate"], Some(example), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        out.contains("limits        3") && out.contains("on_error allow"),
        "{out}"
    );
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
    let path = dir.write(
        "t.toml",
        "[[limits]]\nname = \"from-env-file\"\nrate = 1\nburst = 1\nkey = [\"ip\"]\n",
    );
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

#[test]
fn every_invalid_value_is_refused_naming_its_key() {
    let cases: &[(&str, &str)] = &[
        ("bogus = 1\n", "bogus"),
        ("[store]\ntimeout = 5\n", "store.timeout"),
        ("[store]\nbackend = \"mongo\"\n", "store.backend"),
        ("[store]\ntimeout_ms = 0\n", "store.timeout_ms"),
        ("[store]\non_error = \"maybe\"\n", "store.on_error"),
        ("[store]\nbackend = \"redis\"\nurl = \"http://x\"\n", "store.url"),
        ("[store]\nkey_prefix = \"\"\n", "store.key_prefix"),
        ("listen = \"nowhere\"\n", "listen"),
        ("[client_ip]\ntrusted_proxies = [\"10.0.0.0/33\"]\n", "client_ip.trusted_proxies"),
        ("[client_ip]\nfrom = \"cookie\"\n", "client_ip.from"),
        ("[response]\ndeny_status = 42\n", "response.deny_status"),
        ("[response]\nheaders = [\"draft-7\"]\n", "response.headers"),
        ("[[limits]]\nname = \"a\"\nrate = 0\nburst = 5\nkey = [\"ip\"]\n", "limits.a.rate"),
        ("[[limits]]\nname = \"a\"\nrate = -1\nburst = 5\nkey = [\"ip\"]\n", "limits.a.rate"),
        ("[[limits]]\nname = \"a\"\nrate = 1\nburst = 0\nkey = [\"ip\"]\n", "limits.a.burst"),
        ("[[limits]]\nname = \"a\"\nrate = 1\nburst = 5\ncost = 6\nkey = [\"ip\"]\n", "limits.a.cost"),
        ("[[limits]]\nname = \"a\"\nrate = 1\nburst = 5\nkey = [\"cookie\"]\n", "limits.a.key[0]"),
        ("[[limits]]\nname = \"a\"\nrate = 1\nburst = 5\nkey = []\n", "limits.a.key"),
        ("[[limits]]\nname = \"Bad Name\"\nrate = 1\nburst = 5\nkey = [\"ip\"]\n", "limits.name: \"Bad Name\""),
        ("[[limits]]\nname = \"a\"\nrate = 1\nburst = 5\nkey = [\"ip\"]\n[limits.match]\npath_prefix = \"api\"\n", "limits.a.match.path_prefix"),
        ("[[limits]]\nname = \"a\"\nrate = 1\nburst = 5\nkey = [\"ip\"]\nwindow = 3\n", "window"),
        (&"[[limits]]\nname = \"a\"\nrate = 1\nburst = 5\nkey = [\"ip\"]\n".repeat(2), "limits.a.name"),
        ("[[limits]]\nname = \"a\"\nrate = 1\n", "burst"),
        ("[store\n", "TOML"),
    ];
    for (config, key) in cases {
        let output = run(&["validate"], Some(config), &[]);
        assert_refused(&output, key);
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
