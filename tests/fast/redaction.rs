//! What the admin API shows a reader without the token: an exempt rule's header values (a
//! bypass) and every key value that is not a bare IP address or network as a fingerprint,
//! salted per deployment so a dictionary cannot reverse it; and the salt's settings.

use sha2::{Digest, Sha256};

use crate::support::http::admin_json;
use crate::support::{tollgate_command, TempDir, Tollgate};

const TOKEN: &str = "redaction-admin-token-0123";
const SALT: &str = "redaction-salt-of-this-deployment";

/// An exemption by a shared-secret header, and a limit keyed on an API key.
const LIMITS: &str = r#"
[store]
backend = "memory"

[[exempt]]
name = "internal"
headers = { "x-internal-bypass" = ["let-me-through-7f3a", ""] }
path_prefix = "/internal/"

[[limits]]
name = "per-key"
rate = "1/hour"
burst = 1
key = ["header:x-api-key"]
"#;

fn start(head: &str) -> Tollgate {
    Tollgate::start(&format!("{head}\n{LIMITS}"))
}

fn get(tollgate: &Tollgate, path: &str, token: Option<&str>) -> serde_json::Value {
    let answer = admin_json(tollgate.admin, "GET", path, token, "");
    assert_eq!(answer.status, 200, "{path}: {}", answer.body);
    serde_json::from_str(&answer.body).expect("JSON")
}

/// The unsalted fingerprint of earlier releases: the first 12 hex digits of SHA-256(value).
fn unsalted(value: &str) -> String {
    Sha256::digest(value.as_bytes())[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn exempt_header_values_are_shown_only_to_the_token_holder() {
    let tollgate = start(&format!("admin_token = \"{TOKEN}\""));
    let anonymous = get(&tollgate, "/v1/limits", None);
    let body = anonymous.to_string();
    assert!(!body.contains("let-me-through-7f3a"), "{body}");
    let values = &anonymous["exempt"][0]["match"]["headers"][0]["values"];
    assert_eq!(values[0].as_str().unwrap().len(), 12, "{values}");
    assert_eq!(values[1], "", "\"absent\" hides nothing");
    let operator = get(&tollgate, "/v1/limits", Some(TOKEN));
    assert_eq!(
        operator["exempt"][0]["match"]["headers"][0]["values"][0],
        "let-me-through-7f3a"
    );
    // Without a configured token there is no holder: nobody sees the value.
    let open = start("");
    assert!(!get(&open, "/v1/limits", None)
        .to_string()
        .contains("let-me-through-7f3a"));
}

/// A key value shaped `<ip>/<anything>` is not an address: fingerprinted in the top list and
/// the override list, where only a bare address or network is shown as it is.
#[test]
fn a_value_that_only_starts_like_an_address_is_fingerprinted() {
    let tollgate = start(&format!("admin_token = \"{TOKEN}\""));
    let key = "10.0.0.1/sk_live_secret";
    for _ in 0..3 {
        tollgate.check(&[("x-api-key", key)]);
    }
    let top = get(&tollgate, "/v1/top", None);
    let shown = top["limits"][0]["keys"][0]["key"][0].as_str().unwrap();
    assert_eq!(shown.len(), 12, "{top}");
    assert!(!top.to_string().contains("sk_live_secret"), "{top}");

    let put = admin_json(
        tollgate.admin,
        "PUT",
        "/v1/overrides/per-key?key=10.0.0.1%2Fsk_live_secret",
        Some(TOKEN),
        r#"{"burst": 5}"#,
    );
    assert_eq!(put.status, 200, "{}", put.body);
    let listed = get(&tollgate, "/v1/overrides/per-key", None);
    assert_eq!(listed["overrides"][0]["key"][0], shown, "{listed}");
    let operator = get(&tollgate, "/v1/overrides/per-key", Some(TOKEN));
    assert_eq!(operator["overrides"][0]["key"][0], key);
}

/// A fingerprint depends on the deployment's salt: a configured one (file, setting or
/// environment) is shared by every instance given it, and no fingerprint is the bare hash a
/// dictionary of likely keys would find.
#[test]
fn fingerprints_are_salted_per_deployment() {
    let peeked = |tollgate: &Tollgate| -> String {
        get(tollgate, "/v1/buckets/per-key?key=user-42", None)["key"][0]
            .as_str()
            .unwrap()
            .to_string()
    };
    let salted = start(&format!("fingerprint_salt = \"{SALT}\""));
    let same = Tollgate::start_with_env(
        &format!("\n{LIMITS}"),
        &[("TOLLGATE_FINGERPRINT_SALT", SALT)],
    );
    let dir = TempDir::new("salt");
    let file = dir.write("salt", &format!("{SALT}\n"));
    let from_file = start(&format!(
        "fingerprint_salt_file = {:?}",
        file.display().to_string()
    ));
    let other = start("fingerprint_salt = \"another-deployment-salt-000\"");
    let by_token = start(&format!("admin_token = \"{TOKEN}\""));
    let fingerprint = peeked(&salted);
    assert_eq!(peeked(&same), fingerprint);
    assert_eq!(peeked(&from_file), fingerprint);
    assert_ne!(peeked(&other), fingerprint);
    for tollgate in [&salted, &other, &by_token] {
        assert_ne!(peeked(tollgate), unsalted("user-42"));
    }
}

#[test]
fn a_bad_fingerprint_salt_is_refused_naming_the_key() {
    let dir = TempDir::new("salt-cli");
    let file = dir.write("salt", SALT);
    let cases = [
        (
            "fingerprint_salt = \"short\"\n".to_string(),
            "fingerprint_salt",
        ),
        (
            format!(
                "fingerprint_salt = \"{SALT}\"\nfingerprint_salt_file = {:?}\n",
                file.display().to_string()
            ),
            "fingerprint_salt_file",
        ),
        (
            "fingerprint_salt_file = \"/nonexistent/salt\"\n".to_string(),
            "fingerprint_salt_file",
        ),
    ];
    for (config, key) in cases {
        let output = tollgate_command()
            .arg("validate")
            .arg("--config")
            .arg(dir.write("tollgate.toml", &config))
            .output()
            .expect("run tollgate");
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{config}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("configuration: {key}: ")),
            "{key} named in: {err}"
        );
        assert!(!err.contains(SALT), "the salt never shows: {err}");
    }
}
