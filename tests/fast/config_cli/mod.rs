//! The command line: `validate`, `--version`, and every refused configuration exiting 2 with
//! one line that names the offending key.

use std::process::Output;

use std::time::Duration;

use crate::support::limit;
use crate::support::{
    free_port, make_certificates, make_client_certificate, tollgate_command, wait_until,
    HttpClient, TempDir,
};

mod erl_env;
mod refusals;
mod regions;
mod tls;
mod validate;

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
