//! Real ingress proxies for end-to-end tests: nginx and Traefik from PATH, run from the shipped
//! configs in `config/` (only addresses are templated), in front of a [`backend::Backend`]
//! that counts what reaches it. Clients can pick their loopback source address, so "two
//! different client IPs" is real, not a header.
//!
//! - this file: the proxies as processes (`Nginx`, `Traefik`) and the templating of shipped files;
//! - [`backend`]: the counting application and a client that picks its source address;
//! - [`scenarios`]: the stack around a proxy and the assertions every proxy must pass.

pub mod backend;
pub mod scenarios;

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use self::backend::send_from;
use super::{free_port, require_binary, wait_until, TempDir};

/// The repository's root, where `config/` lives.
pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

pub fn read_shipped(relative: &str) -> String {
    std::fs::read_to_string(repo_path(relative))
        .unwrap_or_else(|e| panic!("read shipped file {relative}: {e}"))
}

/// Replaces each `from` with `to`, insisting that `from` occurs exactly once: if the shipped
/// file changes shape, the test must notice instead of silently testing something else. Each
/// `from` is looked for in the shipped text, not in what another replacement wrote: a port
/// such as 30001 must not count as a second "127.0.0.1:3000".
pub fn template(text: &str, replacements: &[(&str, &str)]) -> String {
    let mut found: Vec<(usize, &str, &str)> = replacements
        .iter()
        .map(|&(from, to)| {
            let count = text.matches(from).count();
            assert_eq!(
                count, 1,
                "expected {from:?} exactly once in the shipped config"
            );
            (text.find(from).unwrap_or_default(), from, to)
        })
        .collect();
    found.sort_by_key(|&(at, _, _)| at);
    let mut out = String::with_capacity(text.len());
    let mut done = 0;
    for (at, from, to) in found {
        assert!(at >= done, "{from:?} overlaps another replaced text");
        out.push_str(&text[done..at]);
        out.push_str(to);
        done = at + from.len();
    }
    out.push_str(&text[done..]);
    out
}

/// Waits until something accepts TCP connections on `addr`.
fn wait_listening(addr: SocketAddr, within: Duration) -> bool {
    wait_until(within, || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
    })
}

/// A child process killed (by its own handle) and reaped on drop.
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// nginx's master process, stopped with SIGTERM on drop: a SIGKILL would leave its worker
/// processes running, orphaned, after the test.
struct NginxMaster(Child);

impl Drop for NginxMaster {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        // Fast shutdown: the master waits for its workers to exit, then exits itself.
        let stopped = wait_until(Duration::from_secs(5), || {
            matches!(self.0.try_wait(), Ok(Some(_)))
        });
        if !stopped {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// nginx running `config/nginx/tollgate.conf` with its three addresses templated, inside a
/// minimal main config that keeps every file (pid, logs, temp paths) in a temp dir.
pub struct Nginx {
    pub addr: SocketAddr,
    _master: NginxMaster,
    dir: TempDir,
}

impl Nginx {
    /// The shipped `config/nginx/tollgate.conf`, pointed at `tollgate` and `backend`.
    pub fn start(tollgate: SocketAddr, backend: SocketAddr) -> Nginx {
        Nginx::start_with(tollgate, backend, &[])
    }

    /// Like [`Nginx::start`], with `more` replacements in the shipped file.
    pub fn start_with(tollgate: SocketAddr, backend: SocketAddr, more: &[(&str, &str)]) -> Nginx {
        Nginx::start_site(|listen| {
            let (tollgate, backend) = (format!("server {tollgate};"), format!("server {backend};"));
            let listen = format!("listen {listen};");
            let mut replacements = vec![
                ("server 127.0.0.1:8080;", tollgate.as_str()),
                ("server 127.0.0.1:3000;", backend.as_str()),
                ("listen 80;", listen.as_str()),
            ];
            replacements.extend_from_slice(more);
            template(&read_shipped("config/nginx/tollgate.conf"), &replacements)
        })
    }

    /// The shipped `k8s/sidecar/nginx.conf` (a whole main config), pointed at `tollgate` and
    /// `backend`, its scratch paths in a temp dir.
    pub fn start_sidecar(tollgate: SocketAddr, backend: SocketAddr) -> Nginx {
        Nginx::start_main(|listen, dir| {
            let d = dir.display();
            template(
                &read_shipped("k8s/sidecar/nginx.conf").replace("/tmp/", &format!("{d}/")),
                &[
                    ("listen 8000;", &format!("listen {listen};")),
                    ("server 127.0.0.1:8080;", &format!("server {tollgate};")),
                    (
                        "server app.default.svc.cluster.local:80;",
                        &format!("server {backend};"),
                    ),
                    ("access_log /dev/stdout;", "access_log off;"),
                    ("worker_processes auto;", "worker_processes 1;"),
                    (
                        "error_log /dev/stderr warn;",
                        &format!("error_log {d}/error.log warn;"),
                    ),
                ],
            )
        })
    }

    /// The ingress-nginx example's snippets inside an nginx config shaped like the one the
    /// controller generates for `auth-url`.
    pub fn start_ingress_nginx(tollgate: SocketAddr, backend: SocketAddr) -> Nginx {
        Nginx::start_site(|listen| ingress_nginx_site(listen, tollgate, backend))
    }

    /// nginx serving the http-context config `site(listen address)`.
    pub fn start_site(site: impl FnOnce(SocketAddr) -> String) -> Nginx {
        Nginx::start_main(|listen, dir| {
            std::fs::write(dir.join("site.conf"), site(listen)).expect("write site.conf");
            let d = dir.display();
            // No `user`: as root, workers drop to nobody, and nginx chowns the temp paths it
            // creates.
            format!(
                "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
                 events {{ worker_connections 1024; }}\n\
                 http {{\n  access_log off;\n\
                   client_body_temp_path {d}/client_body;\n  proxy_temp_path {d}/proxy;\n\
                   fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
                   include {d}/site.conf;\n}}\n"
            )
        })
    }

    /// nginx running the main config `main(listen address, scratch dir)` in the foreground.
    fn start_main(main: impl FnOnce(SocketAddr, &Path) -> String) -> Nginx {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let dir = TempDir::new("nginx");
        let conf = dir.write("nginx.conf", &main(addr, dir.path()));
        let child = Command::new(require_binary("nginx"))
            .args(["-g", "daemon off;"])
            .arg("-p")
            .arg(dir.path())
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start nginx");
        let nginx = Nginx {
            addr,
            _master: NginxMaster(child),
            dir,
        };
        assert!(
            wait_listening(addr, Duration::from_secs(10)),
            "nginx did not come up on {addr}: {}",
            nginx.error_log()
        );
        nginx
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

/// A string at `path` inside a YAML document.
pub fn yaml_text<'a>(value: &'a serde_yaml::Value, path: &[&str]) -> &'a str {
    let mut node = value;
    for key in path {
        node = &node[*key];
    }
    node.as_str()
        .unwrap_or_else(|| panic!("{path:?} is not a string: {node:?}"))
}

/// An annotation of the ingress-nginx example.
fn annotation<'a>(ingress: &'a serde_yaml::Value, name: &str) -> &'a str {
    yaml_text(
        ingress,
        &[
            "metadata",
            "annotations",
            &format!("nginx.ingress.kubernetes.io/{name}"),
        ],
    )
}

/// What ingress-nginx generates for an Ingress with `auth-url` (the lines of its template
/// that matter here), with the example's snippets where the controller puts them.
fn ingress_nginx_site(listen: SocketAddr, tollgate: SocketAddr, backend: SocketAddr) -> String {
    let ingress: serde_yaml::Value =
        serde_yaml::from_str(&read_shipped("k8s/ingress-nginx/ingress.yaml"))
            .expect("the Ingress is valid YAML");
    let auth_url = annotation(&ingress, "auth-url");
    let path = auth_url
        .strip_prefix("http://tollgate.tollgate.svc.cluster.local:8080")
        .expect("auth-url points at the tollgate Service");
    format!(
        "upstream tollgate_auth {{ server {tollgate}; keepalive {keepalive}; keepalive_timeout {timeout}s; }}
server {{
  listen {listen};
  {server_snippet}
  location = /_external-auth {{
    internal;
    proxy_pass_request_body off;
    proxy_set_header Content-Length \"\";
    proxy_set_header X-Forwarded-Proto \"\";
    proxy_set_header Host tollgate.tollgate.svc.cluster.local;
    proxy_set_header X-Original-URL $scheme://$http_host$request_uri;
    proxy_set_header X-Original-Method $request_method;
    proxy_set_header X-Sent-From \"nginx-ingress-controller\";
    proxy_set_header X-Real-IP $remote_addr;
    proxy_set_header X-Forwarded-For $remote_addr;
    proxy_set_header X-Auth-Request-Redirect $request_uri;
    proxy_http_version 1.1;
    proxy_set_header Connection \"\";
    proxy_pass_request_headers on;
    {auth_snippet}
    proxy_pass http://tollgate_auth{path};
  }}
  location / {{
    auth_request /_external-auth;
    auth_request_set $auth_cookie $upstream_http_set_cookie;
    add_header Set-Cookie $auth_cookie;
    proxy_set_header X-Forwarded-For $remote_addr;
    {configuration_snippet}
    proxy_pass http://{backend};
  }}
}}
",
        keepalive = annotation(&ingress, "auth-keepalive"),
        timeout = annotation(&ingress, "auth-keepalive-timeout"),
        server_snippet = annotation(&ingress, "server-snippet"),
        auth_snippet = annotation(&ingress, "auth-snippet"),
        configuration_snippet = annotation(&ingress, "configuration-snippet"),
    )
}

/// Traefik running `config/traefik/traefik.yml` (static) and `config/traefik/dynamic.yml`
/// (file provider) with their addresses templated.
pub struct Traefik {
    pub addr: SocketAddr,
    _child: Owned,
    _dir: TempDir,
}

impl Traefik {
    pub fn start(tollgate: SocketAddr, backend: SocketAddr) -> Traefik {
        Traefik::start_dynamic("config/traefik/dynamic.yml", tollgate, backend, &[])
    }

    /// Traefik with the shipped dynamic config `dynamic` (tollgate's and the application's
    /// addresses templated, plus `more` replacements).
    pub fn start_dynamic(
        dynamic: &str,
        tollgate: SocketAddr,
        backend: SocketAddr,
        more: &[(&str, &str)],
    ) -> Traefik {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let dir = TempDir::new("traefik");
        let check = format!("http://{tollgate}/check");
        let app = format!("http://{backend}");
        let mut replacements = vec![
            ("http://127.0.0.1:8080/check", check.as_str()),
            ("http://127.0.0.1:3000", app.as_str()),
        ];
        replacements.extend_from_slice(more);
        let dynamic = template(&read_shipped(dynamic), &replacements);
        let dynamic_path = dir.write("dynamic.yml", &dynamic);
        let static_config = template(
            &read_shipped("config/traefik/traefik.yml"),
            &[
                ("address: \":80\"", &format!("address: \"{addr}\"")),
                (
                    "filename: /etc/traefik/dynamic.yml",
                    &format!("filename: {}", dynamic_path.display()),
                ),
            ],
        );
        let static_path = dir.write("traefik.yml", &static_config);
        let child = Command::new(require_binary("traefik"))
            .arg(format!("--configFile={}", static_path.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start traefik");
        let traefik = Traefik {
            addr,
            _child: Owned(child),
            _dir: dir,
        };
        assert!(
            wait_listening(addr, Duration::from_secs(20)),
            "traefik did not come up on {addr}"
        );
        // The entry point listens before the file provider's routes load (404 until then).
        assert!(
            wait_until(Duration::from_secs(20), || {
                send_from(Ipv4Addr::new(127, 0, 0, 254), addr, "GET", "/ready", &[])
                    .is_ok_and(|r| r.status != 404)
            }),
            "traefik did not load its routes"
        );
        traefik
    }
}
