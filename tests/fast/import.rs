//! `tollgate import envoy-ratelimit`: envoyproxy/ratelimit YAML, written here in the shapes its
//! documentation describes, converted to TOML that `validate` accepts and that decides over gRPC
//! the way the YAML meant.

use crate::support::chaos::run_tollgate;
use crate::support::deploy::repo_path;
use crate::support::grpc::{self, ask, descriptor, request, OK, OVER_LIMIT};
use crate::support::{redis_config, RedisServer, TempDir};

fn fixture(name: &str) -> String {
    repo_path(&format!("tests/fixtures/envoy-ratelimit/{name}"))
        .display()
        .to_string()
}

fn import(files: &[&str]) -> String {
    let paths: Vec<String> = files.iter().map(|f| fixture(f)).collect();
    let mut args = vec!["import", "envoy-ratelimit"];
    args.extend(paths.iter().map(String::as_str));
    let (code, stdout, stderr) = run_tollgate(&args, &[]);
    assert_eq!(code, Some(0), "import failed: {stderr}");
    stdout
}

#[test]
fn every_rule_becomes_a_limit_or_a_comment_and_the_result_validates() {
    let toml = import(&["sms.yaml", "edge.yaml"]);
    for expected in [
        // A window of N per unit: rate N/unit, burst N.
        "name = \"sms-category-promo-phone\"\nrate = 0.00003472222222222222   # 3 per day\nburst = 3\nkey = [\"descriptor:phone\"]",
        "domains = [\"sms\"]\n[limits.match.descriptors]\n\"category\" = [\"promo\"]",
        "name = \"trial_search\"\nrate = 0.5   # 30 per minute\nburst = 30\nkey = [\"const:all\"]\nshadow = true",
        "# replaces \"trial_search\": not carried over",
        "# detailed_metric: not carried over",
        "# unlimited: no limit emitted",
        "# not converted: requests_per_unit 0 denies every request",
        "# not converted: api = \"v1*\" is a prefix wildcard",
        "# not carried over: unknown field \"tags\"",
        "lets the rules for \"client_ip\" = [\"203.0.113.9\", \"198.51.100.1\"] replace this one",
    ] {
        assert!(toml.contains(expected), "missing {expected:?} in:\n{toml}");
    }
    let dir = TempDir::new("import");
    let path = dir.write("imported.toml", &toml);
    let (code, stdout, stderr) =
        run_tollgate(&["validate", "--config", &path.display().to_string()], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("limits        6"), "{stdout}");
}

#[test]
fn unreadable_or_malformed_files_exit_2_naming_the_file() {
    let dir = TempDir::new("import-bad");
    let bad = dir.write("bad.yaml", "domain: [unclosed\n");
    let no_domain = dir.write("nodomain.yaml", "descriptors: []\n");
    for file in [bad, no_domain, dir.path().join("absent.yaml")] {
        let name = file.display().to_string();
        let (code, _, stderr) = run_tollgate(&["import", "envoy-ratelimit", &name], &[]);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains(&name), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

/// The converted sms rules decide like the YAML: 3 promotional texts a day per number, 60 texts
/// an hour per number whatever the category.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converted_rules_decide_over_grpc_as_the_yaml_meant() {
    let redis = RedisServer::start();
    let (_tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", &import(&["sms.yaml"])));
    let mut client = grpc::client(addr).await;
    let promo = || descriptor(&[("category", "promo"), ("phone", "5550100")]);
    for _ in 0..3 {
        let answer = ask(&mut client, request("sms", vec![promo()])).await;
        assert_eq!(answer.overall_code, OK);
    }
    let fourth = ask(&mut client, request("sms", vec![promo()])).await;
    assert_eq!(fourth.overall_code, OVER_LIMIT);
    let any = ask(
        &mut client,
        request("sms", vec![descriptor(&[("phone", "5550100")])]),
    )
    .await;
    assert_eq!(any.overall_code, OK);
    assert_eq!(any.statuses[0].limit_remaining, 59);
    let other_domain = ask(&mut client, request("mail", vec![promo()])).await;
    assert_eq!(other_domain.overall_code, OK);
}
