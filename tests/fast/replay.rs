//! `tollgate replay`: the binary on an nginx combined log and on JSON lines, its JSON report in
//! the documented shape, unparsable lines counted, and a bad config or log refused with exit 2.

use crate::support::chaos::run_tollgate;
use crate::support::fixtures::A_ZERO_RATE;
use crate::support::TempDir;

const CONFIG: &str = "[store]\nbackend = \"memory\"\n\n[[limits]]\nname = \"per-ip\"\nrate = \"1/min\"\nburst = 2\nkey = [\"ip\"]\n[limits.match]\nhosts = [\"shop.example.com\"]\n";

/// Four requests from one address and one from another in the same second, and a line that
/// is not a request.
fn combined_log() -> String {
    let mut log = String::new();
    for ip in [
        "203.0.113.7",
        "203.0.113.7",
        "203.0.113.7",
        "198.51.100.1",
        "203.0.113.7",
    ] {
        log.push_str(&format!(
            "{ip} - - [04/Dec/2026:10:00:00 +0000] \"GET /cart HTTP/1.1\" 200 12 \"-\" \"curl\"\n"
        ));
    }
    log.push_str("I1204 10:00:01 controller.go:190] Configuration changes detected\n");
    log
}

#[test]
fn a_combined_log_reports_denials_per_limit_and_key_as_json() {
    let dir = TempDir::new("replay");
    let config = dir.write("tollgate.toml", CONFIG);
    let log = dir.write("access.log", &combined_log());
    let (code, stdout, stderr) = run_tollgate(
        &[
            "replay",
            "--config",
            &config.display().to_string(),
            "--host",
            "shop.example.com",
            "--format",
            "json",
            &log.display().to_string(),
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(report["requests"], 5);
    assert_eq!(report["unparsed"], 1);
    assert_eq!(report["denied"], 2);
    let limit = &report["limits"][0];
    assert_eq!(limit["name"], "per-ip");
    assert_eq!(limit["denied"], 2);
    assert_eq!(limit["top"][0]["key"], serde_json::json!(["203.0.113.7"]));
    assert_eq!(limit["top"][0]["denied"], 2);
    assert_eq!(
        limit["top"][0]["first_denied"],
        "04/Dec/2026:10:00:00 +0000"
    );
    assert_eq!(limit["top"].as_array().map(Vec::len), Some(1));

    // Without the host, the limit's hosts match nothing: nothing is denied.
    let (code, stdout, _) = run_tollgate(
        &[
            "replay",
            "--config",
            &config.display().to_string(),
            &log.display().to_string(),
        ],
        &[],
    );
    assert_eq!(code, Some(0));
    assert!(stdout.starts_with("requests 5  denied 0"), "{stdout}");
}

#[test]
fn json_lines_are_read_with_the_field_names_given() {
    let dir = TempDir::new("replay-json");
    let config = dir.write("tollgate.toml", CONFIG);
    let mut log = String::new();
    for ms in [0, 100, 200] {
        log.push_str(&format!(
            "{{\"ts\": 1764842400.{ms:03}, \"client\": \"192.0.2.1\", \"vhost\": \"shop.example.com\", \"uri\": \"/\"}}\n"
        ));
    }
    let log = dir.write("access.json", &log);
    let (code, stdout, stderr) = run_tollgate(
        &[
            "replay",
            "--config",
            &config.display().to_string(),
            "--log-format",
            "json",
            "--field-time",
            "ts",
            "--field-ip",
            "client",
            "--field-host",
            "vhost",
            "--field-path",
            "uri",
            &log.display().to_string(),
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.starts_with("requests 3  denied 1"), "{stdout}");
    assert!(stdout.contains("limit per-ip: 1 denied"), "{stdout}");
    assert!(
        stdout.contains("192.0.2.1  first denied 1764842400.200000"),
        "{stdout}"
    );
}

#[test]
fn a_bad_config_a_missing_log_or_no_config_exit_2_with_one_line() {
    let dir = TempDir::new("replay-bad");
    let good = dir.write("good.toml", CONFIG);
    let bad = dir.write("bad.toml", A_ZERO_RATE);
    let log = dir.write("access.log", &combined_log());
    let absent = dir.path().join("absent.log");
    for args in [
        vec![
            "replay",
            "--config",
            bad.to_str().unwrap(),
            log.to_str().unwrap(),
        ],
        vec![
            "replay",
            "--config",
            good.to_str().unwrap(),
            absent.to_str().unwrap(),
        ],
        vec!["replay", log.to_str().unwrap()],
    ] {
        let (code, stdout, stderr) = run_tollgate(&args, &[]);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    }
}
