//! Envoy Gateway with envoyproxy/ratelimit's image swapped for tollgate's, nothing else
//! changed: tollgate runs with exactly the environment Envoy Gateway gives its rate limit
//! deployment (its files under a temporary directory standing for `/certs`, `/data` and
//! `/etc/statsd-exporter`; free loopback ports standing for 8080, 8081 and 19001), takes its
//! rules from an xDS management server over mutual TLS (tests/support/xds.rs, serving the
//! `RateLimitConfig` Envoy Gateway builds), keeps its buckets in a real Redis, and answers a
//! real Envoy configured as Envoy Gateway configures it
//! (tests/fixtures/envoy-gateway/envoy.yaml), over TLS with Envoy's client certificate.
//!
//! What is asserted is what Envoy Gateway's own e2e test asserts of its rate limit service:
//! 200 until the limit, then 429, another user unaffected, the probe path answering.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

use crate::support::envoy::Envoy;
use crate::support::proxies::backend::{send_from, Backend};
use crate::support::proxies::repo_path;
use crate::support::xds::{XdsServer, RESOURCE_TYPE};
use crate::support::{
    assert_denied, free_port, make_certificates, make_client_certificate, metric_value,
    tollgate_command, wait_until, HttpClient, RedisServer, Response, TempDir, SHORT_TIMINGS,
};

/// The listener of the Gateway `default/eg` named `http`: Envoy Gateway's domain for it.
const DOMAIN: &str = "default/eg/http";
/// The route Envoy Gateway makes of rule 0, match 0 of HTTPRoute `default/http-ratelimit`
/// (no hostnames): the first descriptor entry's key and value.
const ROUTE: &str = "httproute/default/http-ratelimit/rule/0/match/0/*";
/// The entry Envoy Gateway makes of the rule's first client selector (a Distinct header).
const RULE: &str = "rule-0-match-0";
/// The BackendTrafficPolicy's limit: 3 requests per hour per `x-user-id` value, as in Envoy
/// Gateway's e2e manifests.
const LIMIT: usize = 3;
/// The header Envoy adds from the answer's limit (`DRAFT_VERSION_03`), as Envoy Gateway's e2e
/// expects it.
const X_RATELIMIT_LIMIT: &str = "3, 3;w=3600";

/// Long enough for a loaded machine; a passing run waits a fraction of it.
const PATIENCE: Duration = Duration::from_secs(20);

const CLIENT: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// The `RateLimitConfig` Envoy Gateway's translator builds for that policy: one resource per
/// domain, named after it; the route's entry, then the rule's key-only entry with the limit.
fn envoy_gateway_rate_limit_config() -> RateLimitConfig {
    RateLimitConfig {
        name: DOMAIN.into(),
        domain: DOMAIN.into(),
        descriptors: vec![RateLimitDescriptor {
            key: ROUTE.into(),
            value: ROUTE.into(),
            descriptors: vec![RateLimitDescriptor {
                key: RULE.into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Hour as i32,
                    requests_per_unit: LIMIT as u32,
                    ..RateLimitPolicy::default()
                }),
                ..RateLimitDescriptor::default()
            }],
            ..RateLimitDescriptor::default()
        }],
    }
}

/// The directories Envoy Gateway mounts, under one temporary directory: `certs` (the secret
/// `envoy-rate-limit`: `tls.crt`, `tls.key`, `ca.crt`), `etc/statsd-exporter` (`conf.yaml`),
/// and `data`, which Envoy Gateway names in RUNTIME_ROOT but never mounts (the rules come over
/// xDS), so it does not exist here either. Also Envoy's client certificate (`envoy.pem`,
/// `envoy.key`: Envoy Gateway's secret `envoy`, signed by the same CA).
struct Mounts {
    dir: TempDir,
}

impl Mounts {
    fn make() -> Mounts {
        let dir = TempDir::new("envoy-gateway");
        let certs = dir.path().join("certs");
        std::fs::create_dir_all(&certs).unwrap();
        make_certificates(&certs);
        make_client_certificate(&certs, "envoy", "DNS:envoy");
        // make_certificates' server certificate (for 127.0.0.1) is both the rate limit
        // service's and the xDS server's, as Envoy Gateway's certgen signs both with one CA.
        for (from, to) in [
            ("cert.pem", "tls.crt"),
            ("key.pem", "tls.key"),
            ("ca.pem", "ca.crt"),
        ] {
            std::fs::copy(certs.join(from), certs.join(to)).unwrap();
        }
        let exporter = dir.path().join("etc/statsd-exporter");
        std::fs::create_dir_all(&exporter).unwrap();
        std::fs::copy(
            repo_path("tests/fixtures/envoy-gateway/statsd-exporter-conf.yaml"),
            exporter.join("conf.yaml"),
        )
        .unwrap();
        Mounts { dir }
    }

    /// The path standing for `absolute` (`/certs/tls.crt` → `<dir>/certs/tls.crt`).
    fn at(&self, absolute: &str) -> String {
        self.dir
            .path()
            .join(absolute.trim_start_matches('/'))
            .display()
            .to_string()
    }
}

/// tollgate, started as Envoy Gateway starts its rate limit container.
struct Swapped {
    child: Child,
    /// PORT: 8080 there, where the probes ask `/healthcheck`.
    http: SocketAddr,
    /// GRPC_PORT: 8081 there (Envoy Gateway leaves it at its default).
    grpc: SocketAddr,
    /// PROMETHEUS_ADDR: `:19001` there.
    prometheus: SocketAddr,
    /// tollgate's admin listener (not in Envoy Gateway's environment; a free port so that
    /// tests run side by side).
    admin: SocketAddr,
    log: PathBuf,
}

impl Swapped {
    /// `added`: variables an operator adds through `rateLimitDeployment.container.env`.
    fn start(
        mounts: &Mounts,
        xds: &XdsServer,
        redis: &RedisServer,
        added: &[(&str, &str)],
    ) -> Swapped {
        // A port found free may be taken by another test before tollgate binds it: tollgate
        // then exits at once, and new ports are tried.
        for attempt in 1.. {
            let port = |_| free_port();
            let [http, grpc, prometheus, admin] = [0; 4].map(port);
            let log = mounts.dir.path().join(format!("tollgate-{attempt}.log"));
            let mut env = envoy_gateways_environment(mounts, xds, redis, prometheus);
            // The ports standing for Envoy Gateway's.
            env.push(("PORT", http.to_string()));
            env.push(("GRPC_PORT", grpc.to_string()));
            let child = tollgate_command()
                .envs(env)
                .envs(added.iter().copied())
                .env("TOLLGATE_ADMIN_LISTEN", format!("127.0.0.1:{admin}"))
                .env(SHORT_TIMINGS.0, SHORT_TIMINGS.1)
                // A store call's default timeout (50 ms) is short for a loaded test machine,
                // and a timed-out call is allowed (`on_error`): the test must see Redis decide.
                .env("TOLLGATE_STORE__TIMEOUT_MS", "2000")
                .env(
                    "RUST_LOG",
                    std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,redis=error".into()),
                )
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("start tollgate");
            let local = |port: u16| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let mut swapped = Swapped {
                child,
                http: local(http),
                grpc: local(grpc),
                prometheus: local(prometheus),
                admin: local(admin),
                log,
            };
            // The kubelet's startup probe: `/healthcheck` on the HTTP port.
            let mut exited = false;
            let probed = wait_until(PATIENCE, || {
                exited = swapped.child.try_wait().ok().flatten().is_some();
                exited || swapped.healthcheck() == Some(200)
            });
            if exited && attempt < 3 {
                continue;
            }
            assert!(
                probed && !exited,
                "the startup probe never passed: {}",
                swapped.log()
            );
            return swapped;
        }
        unreachable!("the loop returns")
    }

    fn healthcheck(&self) -> Option<u16> {
        let mut client = HttpClient::connect(self.http).ok()?;
        client.get("/healthcheck", &[]).ok().map(|r| r.status)
    }

    fn admin_metrics(&self) -> String {
        HttpClient::connect(self.admin)
            .and_then(|mut c| c.get("/metrics", &[]))
            .map(|r| r.body)
            .unwrap_or_else(|e| panic!("admin /metrics: {e}\n{}", self.log()))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Swapped {
    fn drop(&mut self) {
        // Its own pid, through its own handle.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Envoy Gateway's environment for its rate limit container (envoyproxy/gateway,
/// internal/infrastructure/kubernetes/ratelimit/resource.go), in its order, with a Redis
/// backend and Prometheus metrics on: every variable, none added, only paths and addresses
/// pointed at this test's.
fn envoy_gateways_environment(
    mounts: &Mounts,
    xds: &XdsServer,
    redis: &RedisServer,
    prometheus: u16,
) -> Vec<(&'static str, String)> {
    let path = |p: &str| mounts.at(p);
    vec![
        ("RUNTIME_ROOT", path("/data")),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("RUNTIME_IGNOREDOTFILES", "true".into()),
        ("RUNTIME_WATCH_ROOT", "false".into()),
        ("LOG_LEVEL", "info".into()),
        ("USE_STATSD", "false".into()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
        // envoy-gateway:18001 there.
        ("CONFIG_GRPC_XDS_SERVER_URL", xds.addr.to_string()),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".into()),
        ("GRPC_SERVER_USE_TLS", "true".into()),
        ("GRPC_SERVER_TLS_CERT", path("/certs/tls.crt")),
        ("GRPC_SERVER_TLS_KEY", path("/certs/tls.key")),
        // Not a variable envoyproxy/ratelimit reads (its client CA is GRPC_CLIENT_TLS_CACERT):
        // there as here, the gRPC listener serves TLS without asking for a certificate.
        ("GRPC_SERVER_TLS_CA_CERT", path("/certs/ca.crt")),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", path("/certs/tls.crt")),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", path("/certs/tls.key")),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", path("/certs/ca.crt")),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        ("USE_PROMETHEUS", "true".into()),
        ("PROMETHEUS_ADDR", format!(":{prometheus}")),
        (
            "PROMETHEUS_MAPPER_YAML",
            path("/etc/statsd-exporter/conf.yaml"),
        ),
    ]
}

/// Envoy on tests/fixtures/envoy-gateway/envoy.yaml, pointed at `tollgate` and `app`;
/// `fail_open`: as with `rateLimit.failClosed` false (the fixture fails closed).
fn envoy_as_envoy_gateway_configures_it(
    mounts: &Mounts,
    tollgate: &Swapped,
    app: &Backend,
    fail_open: bool,
) -> Envoy {
    let listener = free_port();
    let mut text = std::fs::read_to_string(repo_path("tests/fixtures/envoy-gateway/envoy.yaml"))
        .expect("read the Envoy Gateway fixture");
    if fail_open {
        let closed = "failure_mode_deny: true";
        assert!(text.contains(closed), "the fixture lost {closed}");
        text = text.replace(closed, "failure_mode_deny: false");
    }
    let filled = [
        ("{{LISTENER_PORT}}", listener.to_string()),
        ("{{APP_PORT}}", app.addr.port().to_string()),
        ("{{RATELIMIT_PORT}}", tollgate.grpc.port().to_string()),
        ("{{ENVOY_CERT}}", mounts.at("/certs/envoy.pem")),
        ("{{ENVOY_KEY}}", mounts.at("/certs/envoy.key")),
        ("{{CERTS}}", mounts.at("/certs")),
    ]
    .iter()
    .fold(text, |text, (from, to)| {
        assert!(text.contains(from), "the fixture lost {from}");
        text.replace(from, to)
    });
    assert!(!filled.contains("{{"), "a placeholder left: {filled}");
    Envoy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, listener)), &filled)
}

/// Everything of one swapped install: dropped in reverse order of start.
struct Install {
    envoy: Envoy,
    app: Backend,
    tollgate: Swapped,
    xds: XdsServer,
    redis: RedisServer,
    _mounts: Mounts,
}

impl Install {
    /// Starts it all: tollgate passes its startup probe while the management server has no
    /// rules yet; then the rules are served, and the install is ready once tollgate
    /// acknowledged them.
    fn start(added: &[(&str, &str)]) -> Install {
        Install::start_with(added, false)
    }

    /// [`Install::start`], Envoy failing open when `fail_open`.
    fn start_with(added: &[(&str, &str)], fail_open: bool) -> Install {
        let mounts = Mounts::make();
        let redis = RedisServer::start();
        let xds = XdsServer::start_tls(&mounts.dir.path().join("certs"));
        let tollgate = Swapped::start(&mounts, &xds, &redis, added);
        xds.set("1", &[envoy_gateway_rate_limit_config()]);
        let ack = xds
            .answer_to("1", PATIENCE)
            .unwrap_or_else(|| panic!("no answer to the snapshot: {}", tollgate.log()));
        assert_eq!(ack.error_detail, None, "the snapshot was refused");
        assert_eq!(ack.version_info, "1");
        let app = Backend::start();
        let envoy = envoy_as_envoy_gateway_configures_it(&mounts, &tollgate, &app, fail_open);
        Install {
            envoy,
            app,
            tollgate,
            xds,
            redis,
            _mounts: mounts,
        }
    }

    fn assert_limit_headers(&self, response: &Response, expected: &[&str]) {
        let values: Vec<&str> = response
            .headers
            .iter()
            .filter(|(name, _)| name == "x-ratelimit-limit")
            .map(|(_, value)| value.as_str())
            .collect();
        assert_eq!(values, expected, "{response:?}\n{}", self.tollgate.log());
    }

    fn get(&self, user: &str) -> Response {
        send_from(
            CLIENT,
            self.envoy.addr,
            "GET",
            "/get",
            &[("x-user-id", user)],
        )
        .unwrap_or_else(|e| {
            panic!(
                "GET as {user}: {e}\n{}\n{}",
                self.envoy.log(),
                self.tollgate.log()
            )
        })
    }

    /// User `one` spends the limit, then is refused; each answer's `X-RateLimit-Limit` values
    /// are `limit_headers`.
    /// Returns the denial.
    fn spend_the_limit_of_user_one(&self, limit_headers: &[&str]) -> Response {
        for n in 1..=LIMIT {
            let allowed = self.get("one");
            assert_eq!(allowed.status, 200, "request {n}: {allowed:?}");
            self.assert_limit_headers(&allowed, limit_headers);
        }
        let denied = self.get("one");
        assert_eq!(denied.status, 429, "{denied:?}\n{}", self.tollgate.log());
        self.assert_limit_headers(&denied, limit_headers);
        // Envoy Gateway turns Envoy's own header off.
        assert_eq!(denied.header("x-envoy-ratelimited"), None, "{denied:?}");
        denied
    }
}

/// Envoy's `X-RateLimit-Limit` (DRAFT_VERSION_03, from the limit tollgate answered) beside
/// tollgate's own `X-RateLimit-Limit: 3`, when an operator asks for tollgate's `x-ratelimit`
/// family on gRPC answers. Envoy Gateway's e2e compares the values joined, so it would see
/// `3,3, 3;w=3600`: in envoyproxy/ratelimit's environment gRPC answers carry none by default.
const BOTH_LIMIT_HEADERS: [&str; 2] = ["3", X_RATELIMIT_LIMIT];

/// tollgate's `x-ratelimit` family asked for on gRPC answers: one variable added to the
/// container (`response.grpc_headers`).
const TOLLGATE_HEADERS: (&str, &str) = ("TOLLGATE_RESPONSE__GRPC_HEADERS", "[\"x-ratelimit\"]");

/// Proves, with Envoy Gateway's environment, rules, Envoy config and certificates unchanged:
/// tollgate passes the startup probe (`/healthcheck` 200) before its rules arrive, as
/// FORCE_START_WITHOUT_INITIAL_CONFIG asks; it connects to the management server over mutual
/// TLS as node `envoy-ratelimit` and acknowledges the `RateLimitConfig`; Envoy reaches it over
/// TLS (fail closed, so every 200 is tollgate's OK); user `one` gets 200 three times, then
/// 429, each with Envoy's `X-RateLimit-Limit` once, as Envoy Gateway's e2e expects it, and none
/// of tollgate's own headers, as envoyproxy/ratelimit sends none (a denial keeps tollgate's
/// `Retry-After`); user `two` is unaffected, and the application saw only the admitted
/// requests; Redis decided (`tollgate_store_up` 1).
#[test]
fn a_swapped_rate_limit_service_limits_per_user_behind_envoy_gateways_envoy() {
    let install = Install::start(&[]);
    let first = install
        .xds
        .received()
        .into_iter()
        .next()
        .expect("a request");
    assert_eq!(first.request.type_url, RESOURCE_TYPE);
    let node = first.request.node.expect("a node");
    assert_eq!(node.id, "envoy-ratelimit");

    let denied = install.spend_the_limit_of_user_one(&[X_RATELIMIT_LIMIT]);
    for name in ["ratelimit", "ratelimit-policy", "ratelimit-limit"] {
        assert_eq!(denied.header(name), None, "{name}: {denied:?}");
    }
    for n in 1..=LIMIT {
        let other = install.get("two");
        assert_eq!(other.status, 200, "user two, request {n}: {other:?}");
    }
    assert_eq!(
        install.app.count(),
        2 * LIMIT,
        "only admitted requests pass"
    );

    assert!(
        install
            .envoy
            .stat("cluster.ratelimit_cluster.ssl.handshake")
            >= 1
    );
    assert_eq!(
        install
            .envoy
            .stat("cluster.ratelimit_cluster.upstream_cx_connect_fail"),
        0
    );
    assert_eq!(install.tollgate.healthcheck(), Some(200));
    let metrics = install.tollgate.admin_metrics();
    assert_eq!(
        metric_value(&metrics, "tollgate_store_up"),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        metric_value(
            &metrics,
            "tollgate_grpc_requests_total{code=\"over_limit\"}"
        ),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "tollgate_grpc_requests_total{code=\"ok\"}"),
        (2 * LIMIT) as f64,
        "{metrics}"
    );
}

/// Proves that tollgate's own headers come back on gRPC answers when asked for with the one
/// variable [`TOLLGATE_HEADERS`]: `X-RateLimit-Limit` twice, Envoy's and tollgate's; the
/// limit still holds.
#[test]
fn tollgates_own_headers_on_grpc_answers_are_one_variable_away() {
    let install = Install::start(&[TOLLGATE_HEADERS]);
    install.spend_the_limit_of_user_one(&BOTH_LIMIT_HEADERS);
    assert_eq!(install.get("two").status, 200);
}

/// Proves that Envoy Gateway's `rateLimit.failClosed` decides what a Redis failure does, as
/// with envoyproxy/ratelimit: in its environment tollgate answers a store failure with an
/// error status (`store.on_error = "error"`), and Envoy's `failure_mode_deny` decides. Failing
/// closed, the request is refused (Envoy's 500) and the application not called; failing
/// open, it passes. `TOLLGATE_STORE__ON_ERROR=deny` added to the container refuses whatever
/// Envoy says (429, `Retry-After: 1`).
#[test]
fn with_redis_gone_envoys_fail_closed_decides_as_with_envoyproxy_ratelimit() {
    let mut closed = Install::start(&[]);
    closed.redis.kill();
    let refused = closed.get("one");
    assert_eq!(refused.status, 500, "failing closed: {refused:?}");
    assert_eq!(closed.app.count(), 0);
    let metrics = closed.tollgate.admin_metrics();
    assert!(
        metric_value(&metrics, "tollgate_grpc_requests_total{code=\"error\"}") >= 1.0,
        "{metrics}"
    );

    let mut open = Install::start_with(&[], true);
    open.redis.kill();
    let admitted = open.get("one");
    assert_eq!(admitted.status, 200, "failing open: {admitted:?}");
    assert_eq!(open.app.count(), 1);

    let mut denying = Install::start(&[("TOLLGATE_STORE__ON_ERROR", "deny")]);
    denying.redis.kill();
    let refused = denying.get("one");
    // on_error = "deny"
    assert_denied(&refused, Some(1));
    assert_eq!(denying.app.count(), 0);
}

/// The value of the sample of `name` whose labels include every one of `labels`, if any.
fn sample_labelled(exposition: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let inside = series
            .strip_prefix(name)?
            .strip_prefix('{')?
            .strip_suffix('}')?;
        let all = labels.iter().all(|(label, wanted)| {
            inside
                .split(',')
                .any(|pair| pair == format!("{label}=\"{wanted}\""))
        });
        all.then(|| value.parse().ok()).flatten()
    })
}

/// Proves what Envoy Gateway's e2e polls once a client was refused: on PROMETHEUS_ADDR, the
/// series `ratelimit_service_rate_limit_over_limit` of that rule, labelled as Envoy Gateway's
/// statsd mapping (PROMETHEUS_MAPPER_YAML) labels envoyproxy/ratelimit's stats key
/// `<domain>.<route>_<route>.rule-0-match-0`, is above 0. Envoy Gateway polls every 3 s for a
/// minute; this polls more often, for [`PATIENCE`].
#[test]
fn the_over_limit_series_envoy_gateways_e2e_polls_is_on_prometheus_addr() {
    let install = Install::start(&[]);
    install.spend_the_limit_of_user_one(&[X_RATELIMIT_LIMIT]);
    let route_entry = format!("{ROUTE}_{ROUTE}");
    let labels = [
        ("domain", DOMAIN),
        ("key1", route_entry.as_str()),
        ("key2", RULE),
    ];
    let name = "ratelimit_service_rate_limit_over_limit";
    let mut exposition = String::new();
    let seen = wait_until(PATIENCE, || {
        exposition = HttpClient::connect(install.tollgate.prometheus)
            .and_then(|mut c| c.get("/metrics", &[]))
            .map(|r| r.body)
            .unwrap_or_default();
        sample_labelled(&exposition, name, &labels).is_some_and(|v| v > 0.0)
    });
    assert!(
        seen,
        "no {name} {labels:?} above 0 on PROMETHEUS_ADDR:\n{exposition}\n{}",
        install.tollgate.log()
    );
}
