//! Helpers for the deployment artifacts: repository paths, external linters, YAML read through
//! PyYAML (installed with kubernetes-validate), a trivial upstream for nginx, metric names.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// Runs a command to completion with `stdin` fed in; panics if it cannot start.
pub fn run(command: &mut Command, stdin: &str) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?} ({e}): run scripts/test.sh"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The Kubernetes version the manifests and the chart are validated against.
const KUBERNETES_VERSION: &str = "1.31.0";

/// Runs `kubernetes-validate --strict` on `files` and asserts that it passed, with `objects`
/// objects validated in all.
pub fn assert_kubernetes_valid<P: AsRef<Path>>(files: &[P], objects: usize) {
    let output = run(
        Command::new("kubernetes-validate")
            .args(["-k", KUBERNETES_VERSION, "--strict"])
            .args(files.iter().map(AsRef::as_ref)),
        "",
    );
    let report = text(&output);
    assert!(output.status.success(), "{report}");
    let passed = report
        .lines()
        .filter(|l| l.contains(" passed for resource "))
        .count();
    assert_eq!(passed, objects, "every object validated:\n{report}");
}

/// Every document of a YAML file, as JSON values (empty documents skipped).
pub fn yaml_documents(path: &Path) -> Vec<serde_json::Value> {
    const TO_JSON: &str = "import json, sys, yaml\n\
        docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]\n\
        print(json.dumps(docs))";
    let output = run(Command::new("python3").args(["-c", TO_JSON]).arg(path), "");
    assert!(
        output.status.success(),
        "{} is not well-formed YAML: {}",
        path.display(),
        text(&output)
    );
    serde_json::from_slice(&output.stdout).expect("python printed JSON")
}

/// YAML files below `dir`, recursively, sorted.
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Metric names (`tollgate_...`) mentioned in a PromQL expression.
pub fn metric_names_in(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut at = 0;
    while let Some(found) = expr[at..].find("tollgate_") {
        let start = at + found;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        let boundary =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        if boundary {
            names.insert(expr[start..end].to_string());
        }
        at = end;
    }
    names
}

/// Sample names (with `_bucket`, `_sum`, `_count`) in a Prometheus text exposition.
pub fn exposed_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// An upstream that answers every request `200 ok` and closes: the application behind nginx.
pub fn ok_upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let _ = reader
                .get_mut()
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    port
}
