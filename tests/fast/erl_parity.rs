//! envoyproxy/ratelimit as its own deployments run it, against the real binary, a real Redis
//! and a tonic client: YAML in subdirectories of its runtime directory, merged domains
//! (`MERGE_DOMAIN_CONFIG`), the `RateLimit-*` headers (`LIMIT_RESPONSE_HEADERS_ENABLED`), and
//! hostile YAML refused before it is parsed.

use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;

use crate::support::chaos::run_tollgate;
use crate::support::grpc::{self, ask, descriptor, header, request, OK, OVER_LIMIT};
use crate::support::{redis_config, wait_until, RedisServer, TempDir, Tollgate};

/// Runs these tests one after another: each starts a Redis and a tollgate.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn per_minute(domain: &str, key: &str, n: u32) -> String {
    format!("domain: {domain}\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: minute, requests_per_unit: {n}}}\n")
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// envoyproxy/ratelimit's environment for a runtime directory `<root>/rl/config`, its gRPC
/// listener on `grpc_port`, its Redis `redis`.
fn erl_env<'a>(
    root: &'a str,
    grpc_port: &'a str,
    redis: &'a str,
    more: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("RUNTIME_ROOT", root),
        ("RUNTIME_SUBDIRECTORY", "rl"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", redis),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", grpc_port),
        // Generous, as `redis_config`'s: a slow call on a loaded machine must not be answered
        // by `on_error` (without quota headers).
        ("TOLLGATE_STORE__TIMEOUT_MS", "2000"),
    ];
    env.extend_from_slice(more);
    env
}

async fn codes(client: &mut grpc::Client, domain: &str, key: &str, times: usize) -> Vec<i32> {
    let mut codes = Vec::new();
    for _ in 0..times {
        let answer = ask(client, request(domain, vec![descriptor(&[(key, "v")])])).await;
        codes.push(answer.overall_code);
    }
    codes
}

fn requests_per_unit(response: &RateLimitResponse) -> u32 {
    response.statuses[0]
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit)
}

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

/// service/ratelimit.go with `LIMIT_RESPONSE_HEADERS_ENABLED`: the answer carries
/// `RateLimit-Limit`, `-Remaining` and `-Reset` of the descriptor nearest its limit, under the
/// names `LIMIT_*_HEADER` give; without the variable, none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_response_headers_show_the_descriptor_nearest_its_limit() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let dir = TempDir::new("erl-headers");
    let yaml = "domain: d\ndescriptors:\n  - key: wide\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: narrow\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    write(&dir.path().join("rl/config/d.yaml"), yaml);
    let (root, port) = (
        dir.path().display().to_string(),
        crate::support::free_port().to_string(),
    );
    let redis_url = format!("127.0.0.1:{}", redis.port);
    let env = erl_env(
        &root,
        &port,
        &redis_url,
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_REMAINING_HEADER", "X-Left"),
        ],
    );
    let tollgate = Tollgate::start_with_env("", &env);
    let mut client = grpc::client(format!("127.0.0.1:{port}").parse().unwrap()).await;
    let both = || {
        request(
            "d",
            vec![descriptor(&[("wide", "u")]), descriptor(&[("narrow", "u")])],
        )
    };
    let first = ask(&mut client, both()).await;
    assert_eq!(first.overall_code, OK);
    assert_eq!(header(&first, "RateLimit-Limit"), Some("2"));
    assert_eq!(header(&first, "X-Left"), Some("1"));
    assert_eq!(header(&first, "RateLimit-Remaining"), None, "renamed");
    // Seconds until the narrow bucket is full again: one token at 2 per minute.
    let reset: u64 = header(&first, "RateLimit-Reset").unwrap().parse().unwrap();
    assert!((29..=31).contains(&reset), "{reset}");
    ask(&mut client, both()).await;
    let over = ask(&mut client, both()).await;
    assert_eq!(over.overall_code, OVER_LIMIT);
    assert_eq!(header(&over, "RateLimit-Limit"), Some("2"));
    assert_eq!(header(&over, "X-Left"), Some("0"));
    drop(tollgate);

    let port = crate::support::free_port().to_string();
    let _plain = Tollgate::start_with_env("", &erl_env(&root, &port, &redis_url, &[]));
    let mut client = grpc::client(format!("127.0.0.1:{port}").parse().unwrap()).await;
    let answer = ask(
        &mut client,
        request("d", vec![descriptor(&[("wide", "fresh")])]),
    )
    .await;
    assert_eq!(header(&answer, "RateLimit-Limit"), None, "off by default");
}

/// The same family on `/check` through `[response] headers`, renamed by
/// `[response.ratelimit_names]`, and not there by default.
#[test]
fn the_ratelimit_family_renders_on_check_when_configured() {
    let redis = RedisServer::start();
    let limits = "[[limits]]\nname = \"per-ip\"\nrate = 1\nburst = 4\nkey = [\"ip\"]\n";
    let configured = format!(
        "[response]\nheaders = [\"ratelimit\"]\n[response.ratelimit_names]\nreset = \"X-Reset\"\n\n{limits}"
    );
    let tollgate = Tollgate::start(&redis_config(&redis, "", &configured));
    let answer = tollgate.check(&[("X-Forwarded-For", "203.0.113.7")]);
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("ratelimit-limit"), Some("4"));
    assert_eq!(answer.header("ratelimit-remaining"), Some("3"));
    assert_eq!(answer.header("x-reset"), Some("1"));
    assert_eq!(
        answer.header("x-ratelimit-limit"),
        None,
        "only the families listed"
    );
    drop(tollgate);
    let tollgate = Tollgate::start(&redis_config(&redis, "", limits));
    let answer = tollgate.check(&[("X-Forwarded-For", "203.0.113.8")]);
    assert_eq!(answer.header("ratelimit-limit"), None, "off by default");
    assert_eq!(answer.header("x-ratelimit-limit"), Some("4"));
}

/// A bad header name in `[response.ratelimit_names]` stops the start (exit 2, naming the key).
#[test]
fn a_ratelimit_name_that_is_no_header_name_is_refused() {
    let dir = TempDir::new("names");
    let path = dir.write(
        "tollgate.toml",
        "[response.ratelimit_names]\nlimit = \"Rate Limit\"\n",
    );
    let (code, _, stderr) =
        run_tollgate(&["validate", "--config", &path.display().to_string()], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("response.ratelimit_names.limit"),
        "{stderr}"
    );
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

/// A named pipe standing in for `admin_token_file`, which a reload reads before and after the
/// config directory: fed while `feeding`, so that a test can hold a reload at that point (the reader
/// waits for a writer) and let it go.
struct TokenPipe {
    path: std::path::PathBuf,
    feeding: std::sync::Arc<std::sync::atomic::AtomicBool>,
    idle: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    feeder: Option<std::thread::JoinHandle<()>>,
}

const TOKEN: &[u8] = b"s3cret-admin-token-0123";

impl TokenPipe {
    fn new(dir: &Path) -> TokenPipe {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let path = dir.join("token");
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        let (feeding, idle, stop) = (
            Arc::new(AtomicBool::new(true)),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let feeder = {
            let (path, feeding, idle, stop) =
                (path.clone(), feeding.clone(), idle.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    if !feeding.load(Ordering::SeqCst) {
                        idle.store(true, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    match Self::open_for_a_reader(&path) {
                        Some(mut reader_waiting) => {
                            use std::io::Write;
                            let _ = reader_waiting.write_all(TOKEN);
                        }
                        None => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        TokenPipe {
            path,
            feeding,
            idle,
            stop,
            feeder: Some(feeder),
        }
    }

    /// The pipe opened for writing when a reader has it open; `None` at once otherwise.
    fn open_for_a_reader(path: &Path) -> Option<std::fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .ok()
    }

    /// Stops feeding: from now on a read waits.
    fn hold(&self) {
        use std::sync::atomic::Ordering;
        self.feeding.store(false, Ordering::SeqCst);
        while !self.idle.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until a read is waiting (a reload got there), and returns its writer.
    fn waiting_reader(&self) -> std::fs::File {
        let mut writer = None;
        assert!(
            wait_until(Duration::from_secs(10), || {
                writer = Self::open_for_a_reader(&self.path);
                writer.is_some()
            }),
            "no reload came to read the token"
        );
        writer.unwrap()
    }

    /// Starts watching the pipe; the function returned waits until a reader has closed it
    /// since (so that the next reader to open it is a new read).
    fn watch_reader_closes(&self) -> impl FnOnce() {
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: a system call without pointers; the descriptor is this function's.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1");
        let path = std::ffi::CString::new(self.path.as_os_str().as_bytes()).unwrap();
        // SAFETY: `path` is NUL-terminated and outlives the call.
        let watch = unsafe { libc::inotify_add_watch(fd, path.as_ptr(), libc::IN_CLOSE_NOWRITE) };
        assert!(watch >= 0, "inotify_add_watch");
        move || {
            // Only closes by a reader are watched: any event is one.
            let mut buffer = [0u8; 4096];
            // SAFETY: reads at most the buffer's length into it.
            let read = unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) };
            // SAFETY: closes the descriptor opened above, used no more.
            unsafe { libc::close(fd) };
            assert!(read > 0, "no close of the pipe was seen");
        }
    }

    fn release(&self) {
        use std::sync::atomic::Ordering;
        self.idle.store(false, Ordering::SeqCst);
        self.feeding.store(true, Ordering::SeqCst);
    }

    fn config_line(&self) -> String {
        format!("admin_token_file = {:?}\n", self.path.display().to_string())
    }
}

impl Drop for TokenPipe {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(feeder) = self.feeder.take() {
            let _ = feeder.join();
        }
    }
}

/// SIGTERM while a reload is stuck (here reading an `admin_token_file` that is a pipe nobody
/// writes to any more): the instance still stops, because a reload never runs on the thread
/// that hears signals. Before, it never would.
#[test]
fn sigterm_stops_the_instance_while_a_reload_is_stuck() {
    let dir = TempDir::new("stuck-reload");
    let pipe = TokenPipe::new(dir.path());
    let mut tollgate = Tollgate::start(&pipe.config_line());
    pipe.hold();
    tollgate.signal("HUP");
    drop(pipe.waiting_reader());
    // The writer closed without writing: the reload read an empty token and was refused.
    // Hold the next one for good.
    tollgate.signal("HUP");
    let stuck = pipe.waiting_reader();
    tollgate.signal("TERM");
    assert_eq!(
        tollgate.wait_exit(Duration::from_secs(30)),
        Some(0),
        "SIGTERM was not heard during the reload"
    );
    drop(stuck);
}

/// A file changed while the directory's reload was reading it is read by the next one: the
/// reload remembers the directory as it was before it read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_during_a_reload_is_read_by_the_next_one() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let dir = TempDir::new("reload-race");
    let rules = dir.path().join("config");
    write(&rules.join("a.yaml"), &per_minute("d", "k", 1));
    let pipe = TokenPipe::new(dir.path());
    // Top-level keys come before the tables `redis_config` writes.
    let toml = format!("[envoy]\nconfig_dir = {:?}\n", rules.display().to_string());
    let config = format!("{}{}", pipe.config_line(), redis_config(&redis, "", &toml));
    let (_tollgate, addr) = grpc::tollgate_with_env(&config, &[crate::support::SHORT_TIMINGS]);
    let mut client = grpc::client(addr).await;
    let served = |r: &RateLimitResponse| requests_per_unit(r);
    let ask_once = |client: &mut grpc::Client| {
        let mut client = client.clone();
        async move { ask(&mut client, request("d", vec![descriptor(&[("k", "x")])])).await }
    };
    assert_eq!(served(&ask_once(&mut client).await), 1);

    use std::io::Write;
    pipe.hold();
    let closed_by_a_reader = pipe.watch_reader_closes();
    write(&rules.join("a.yaml"), &per_minute("d", "k", 22));
    // A reload reads the token as it loads the config, then the directory, then the token
    // again as it builds the rules: let the first read through, hold the second.
    pipe.waiting_reader().write_all(TOKEN).unwrap();
    closed_by_a_reader();
    let mut second = pipe.waiting_reader();
    // The reload has read 22; meanwhile the file changes again.
    write(&rules.join("a.yaml"), &per_minute("d", "k", 333));
    second.write_all(TOKEN).unwrap();
    drop(second);
    pipe.release();
    let mut now = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while now != 333 && std::time::Instant::now() < deadline {
        tokio::time::sleep(crate::support::short_timings().watch_every / 5).await;
        now = served(&ask_once(&mut client).await);
    }
    assert_eq!(now, 333, "the change made during the reload was never read");
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

/// service/ratelimit.go `ratelimitToMetadata` with `RESPONSE_DYNAMIC_METADATA`: per
/// descriptor its `entries` (`key=value`) and its own `hitsAddend`; `metadata` merges the rules
/// of the descriptors that passed: a shadow-mode rule over its limit passed (its status is OK),
/// an unlimited one is left out, one over its limit is left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_metadata_lists_each_descriptor_and_the_rules_that_passed() {
    use envoy_types::pb::google::protobuf::value::Kind;
    use envoy_types::pb::google::protobuf::{Struct, UInt64Value, Value};

    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let dir = TempDir::new("erl-metadata");
    let yaml = "domain: d
descriptors:
  - key: shadow
    shadow_mode: true
    metadata: {from: shadow}
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: free
    metadata: {from_free: yes}
    rate_limit: {unlimited: true}
  - key: tight
    metadata: {from_tight: 1}
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    write(&dir.path().join("rl/config/d.yaml"), yaml);
    let (root, port) = (
        dir.path().display().to_string(),
        crate::support::free_port().to_string(),
    );
    let redis_url = format!("127.0.0.1:{}", redis.port);
    let env = erl_env(
        &root,
        &port,
        &redis_url,
        &[("RESPONSE_DYNAMIC_METADATA", "true")],
    );
    let _tollgate = Tollgate::start_with_env("", &env);
    let mut client = grpc::client(format!("127.0.0.1:{port}").parse().unwrap()).await;
    let mut tight = descriptor(&[("tight", "t")]);
    tight.hits_addend = Some(UInt64Value { value: 2 });
    let answer = ask(
        &mut client,
        request(
            "d",
            vec![
                descriptor(&[("shadow", "s")]),
                descriptor(&[("free", "f")]),
                tight,
            ],
        ),
    )
    .await;
    assert_eq!(
        answer.statuses[2].code, OVER_LIMIT,
        "2 hits on a limit of 1"
    );
    let meta = answer.dynamic_metadata.expect("dynamic metadata");
    let get = |s: &Struct, name: &str| s.fields.get(name).and_then(|v| v.kind.clone());
    let Some(Kind::ListValue(descriptors)) = get(&meta, "descriptors") else {
        panic!("no descriptors: {meta:?}");
    };
    let one = |i: usize| match &descriptors.values[i].kind {
        Some(Kind::StructValue(s)) => s.clone(),
        other => panic!("descriptor {i}: {other:?}"),
    };
    let text = |v: &Value| match &v.kind {
        Some(Kind::StringValue(s)) => s.clone(),
        other => panic!("{other:?}"),
    };
    let Some(Kind::ListValue(entries)) = get(&one(0), "entries") else {
        panic!("no entries");
    };
    assert_eq!(
        entries.values.iter().map(text).collect::<Vec<_>>(),
        ["shadow=s"]
    );
    assert_eq!(get(&one(2), "hitsAddend"), Some(Kind::NumberValue(2.0)));
    assert_eq!(
        get(&one(0), "hitsAddend"),
        None,
        "only when the descriptor has its own"
    );
    let Some(Kind::StructValue(passed)) = get(&meta, "metadata") else {
        panic!("no metadata: {meta:?}");
    };
    let mut keys: Vec<&str> = passed.fields.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["from"],
        "the shadow rule passed; unlimited and over left out"
    );
}
