//! envoyproxy/ratelimit's config files: domains in subdirectories, merged domains, too deep
//! files, and `import` of one domain.

use super::*;

/// goruntime walks the whole runtime directory: a domain whose file sits in a subdirectory of
/// `config/` limits like one at the top, a `..`-named directory (a ConfigMap's) is not read,
/// and an edit of the nested file is served without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_in_a_subdirectory_limits_and_its_edits_are_served() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let dir = TempDir::new("erl-nested");
    let config = dir.path().join("rl/config");
    write(&config.join("a.yaml"), &per_minute("d", "k", 2));
    write(&config.join("team-b/b.yaml"), &per_minute("d2", "k", 2));
    write(
        &config.join("..2026_12_06/c.yaml"),
        &per_minute("d3", "k", 1),
    );
    let (root, port) = (
        dir.path().display().to_string(),
        crate::support::free_port().to_string(),
    );
    let redis_url = format!("127.0.0.1:{}", redis.port);
    let short = crate::support::SHORT_TIMINGS;
    let env = erl_env(&root, &port, &redis_url, &[short]);
    let (code, stdout, stderr) = run_tollgate(&["validate"], &env);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("in domains [d, d2]"), "{stdout}");
    let _tollgate = Tollgate::start_with_env("", &env);
    let mut client = grpc::client(format!("127.0.0.1:{port}").parse().unwrap()).await;

    assert_eq!(codes(&mut client, "d", "k", 3).await, [OK, OK, OVER_LIMIT]);
    assert_eq!(
        codes(&mut client, "d2", "k", 3).await,
        [OK, OK, OVER_LIMIT],
        "the nested file's domain limits"
    );
    assert_eq!(
        codes(&mut client, "d3", "k", 2).await,
        [OK, OK],
        "dot entries skipped"
    );

    write(&config.join("team-b/b.yaml"), &per_minute("d2", "k", 7));
    let mut served = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while served != 7 && std::time::Instant::now() < deadline {
        tokio::time::sleep(crate::support::short_timings().watch_every / 5).await;
        let answer = ask(&mut client, request("d2", vec![descriptor(&[("k", "w")])])).await;
        served = requests_per_unit(&answer);
    }
    assert_eq!(served, 7, "the edited nested file is served");
}

/// `MERGE_DOMAIN_CONFIG=true`: two files of one domain serve both files' descriptors; false
/// (the default) refuses them at start as envoyproxy/ratelimit does, and a descriptor both
/// files declare is refused even when merging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_domain_config_joins_the_files_of_one_domain() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let dir = TempDir::new("erl-merge");
    let config = dir.path().join("rl/config");
    write(&config.join("one.yaml"), &per_minute("d", "k1", 1));
    write(&config.join("two/two.yaml"), &per_minute("d", "k2", 2));
    let (root, port) = (
        dir.path().display().to_string(),
        crate::support::free_port().to_string(),
    );
    let redis_url = format!("127.0.0.1:{}", redis.port);

    let (code, _, stderr) = run_tollgate(&["validate"], &erl_env(&root, &port, &redis_url, &[]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("duplicate domain \"d\""), "{stderr}");
    assert!(stderr.contains("two.yaml"), "names the file: {stderr}");

    let merge = [("MERGE_DOMAIN_CONFIG", "true")];
    let (code, stdout, stderr) =
        run_tollgate(&["validate"], &erl_env(&root, &port, &redis_url, &merge));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("merged domains"), "{stdout}");
    let _tollgate = Tollgate::start_with_env("", &erl_env(&root, &port, &redis_url, &merge));
    let mut client = grpc::client(format!("127.0.0.1:{port}").parse().unwrap()).await;
    assert_eq!(codes(&mut client, "d", "k1", 2).await, [OK, OVER_LIMIT]);
    assert_eq!(codes(&mut client, "d", "k2", 3).await, [OK, OK, OVER_LIMIT]);

    write(&config.join("two/two.yaml"), &per_minute("d", "k1", 5));
    let (code, _, stderr) = run_tollgate(&["validate"], &erl_env(&root, &port, &redis_url, &merge));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("duplicate descriptor composite key"),
        "{stderr}"
    );
    assert!(stderr.contains("two.yaml"), "names the file: {stderr}");
}

/// A file of deeply nested brackets (quadratic for the YAML parser) is refused before parsing
/// when the directory is reloaded; the running rules stay in force, and `validate` names the
/// file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_deep_file_is_refused_on_reload_and_the_running_rules_stay() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let dir = TempDir::new("erl-deep");
    let config = dir.path().join("rl/config");
    write(&config.join("a.yaml"), &per_minute("d", "k", 1));
    let (root, port) = (
        dir.path().display().to_string(),
        crate::support::free_port().to_string(),
    );
    let redis_url = format!("127.0.0.1:{}", redis.port);
    let env = erl_env(&root, &port, &redis_url, &[crate::support::SHORT_TIMINGS]);
    let tollgate = Tollgate::start_with_env("", &env);
    let mut client = grpc::client(format!("127.0.0.1:{port}").parse().unwrap()).await;

    let n = 100_000;
    let deep = format!("domain: e\nmetadata: {}{}\n", "[".repeat(n), "]".repeat(n));
    write(&config.join("deep.yaml"), &deep);
    let refused = || tollgate.metric(r#"tollgate_config_reloads_total{result="failure"}"#);
    assert!(
        wait_until(Duration::from_secs(10), || refused() == 1.0),
        "the reload was not refused"
    );
    assert_eq!(
        codes(&mut client, "d", "k", 2).await,
        [OK, OVER_LIMIT],
        "rules kept"
    );

    let (code, _, stderr) = run_tollgate(&["validate"], &env);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("deep.yaml"), "{stderr}");
    assert!(stderr.contains("nested deeper than 128 levels"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

/// `import envoy-ratelimit --merge-domains`: two files of one domain become one domain's
/// rules, which `validate` accepts; without the flag they are refused. An input past its cap
/// is refused naming it, before it is read whole or parsed.
#[test]
fn import_merges_one_domain_and_refuses_oversized_inputs() {
    let dir = TempDir::new("import-merge");
    let one = dir.write("one.yaml", &per_minute("d", "k1", 1));
    let two = dir.write("two.yaml", &per_minute("d", "k2", 2));
    let (one, two) = (one.display().to_string(), two.display().to_string());
    let (code, _, stderr) = run_tollgate(&["import", "envoy-ratelimit", &one, &two], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("duplicate domain \"d\""), "{stderr}");
    let (code, toml, stderr) = run_tollgate(
        &["import", "envoy-ratelimit", "--merge-domains", &one, &two],
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let path = dir.write("merged.toml", &toml).display().to_string();
    let (code, stdout, stderr) = run_tollgate(&["validate", "--config", &path], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("envoy rules   2 (2 with rate_limit) in domains [d]"),
        "{stdout}"
    );

    // Sparse files: no disk, and far more than the caps.
    let big = dir.path().join("big.yaml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(3 << 30)
        .unwrap();
    let big = big.display().to_string();
    for (kind, cap) in [("envoy-ratelimit", "1 MiB"), ("ingress-nginx", "64 MiB")] {
        let (code, _, stderr) = run_tollgate(&["import", kind, &big], &[]);
        assert_eq!(code, Some(2), "{kind}: {stderr}");
        assert!(stderr.contains(&big), "{kind} names the file: {stderr}");
        assert!(
            stderr.contains(&format!("larger than {cap}")),
            "{kind}: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{kind}: {stderr}");
    }
    let n = 100_000;
    let deep = dir.write(
        "deep.yaml",
        &format!("domain: e\nmetadata: {}{}\n", "[".repeat(n), "]".repeat(n)),
    );
    let deep = deep.display().to_string();
    for kind in ["envoy-ratelimit", "ingress-nginx"] {
        let (code, _, stderr) = run_tollgate(&["import", kind, &deep], &[]);
        assert_eq!(code, Some(2), "{kind}: {stderr}");
        assert!(
            stderr.contains("nested deeper than 128 levels"),
            "{kind}: {stderr}"
        );
    }
}
