//! An ingress-nginx Ingress, translated by `tollgate import ingress-nginx`, deployed as printed
//! behind the real nginx and the real Traefik running the shipped configs, and driven by
//! clients from several loopback addresses: the limit the annotations promised holds per
//! client IP, with its burst, its whitelist and tollgate's status, and a global limit holds
//! per API key.

use std::net::Ipv4Addr;

use crate::support::chaos::run_tollgate;
use crate::support::proxies::backend::send_from;
use crate::support::proxies::scenarios::{Proxy, Stack};
use crate::support::proxies::{Nginx, Traefik};
use crate::support::TempDir;

const INGRESS: &str = "apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  namespace: shop
  annotations:
    nginx.ingress.kubernetes.io/limit-rpm: \"1\"
    nginx.ingress.kubernetes.io/limit-burst-multiplier: \"2\"
    nginx.ingress.kubernetes.io/limit-whitelist: \"127.0.0.4/32\"
spec:
  rules:
  - http:
      paths:
      - path: /web
        pathType: Prefix
        backend:
          service:
            name: web
            port:
              number: 80
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: api
  namespace: shop
  annotations:
    nginx.ingress.kubernetes.io/global-rate-limit: \"2\"
    nginx.ingress.kubernetes.io/global-rate-limit-window: \"1h\"
    nginx.ingress.kubernetes.io/global-rate-limit-key: \"$http_x_api_key\"
spec:
  rules:
  - http:
      paths:
      - path: /api
        pathType: Prefix
        backend:
          service:
            name: api
            port:
              number: 80
";

#[test]
fn an_imported_ingress_limits_each_client_ip_behind_nginx() {
    let stack = Stack::start("deny", &imported(), Nginx::start);
    assert_annotations_hold(&stack);
}

#[test]
fn an_imported_ingress_limits_each_client_ip_behind_traefik() {
    let stack = Stack::start("deny", &imported(), Traefik::start);
    assert_annotations_hold(&stack);
}

/// The TOML `tollgate import ingress-nginx` prints for [`INGRESS`].
fn imported() -> String {
    let dir = TempDir::new("import-ingress-e2e");
    let yaml = dir.write("ingress.yaml", INGRESS);
    let (code, toml, stderr) = run_tollgate(
        &["import", "ingress-nginx", &yaml.display().to_string()],
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}");
    toml
}

fn assert_annotations_hold<P: Proxy>(stack: &Stack<P>) {
    let send = |source: Ipv4Addr, path: &str, headers: &[(&str, &str)]| {
        send_from(source, stack.addr(), "GET", path, headers)
            .expect("answered")
            .status
    };
    let from = |source: Ipv4Addr| send(source, "/web/", &[]);
    let (a, b, whitelisted) = (
        Ipv4Addr::new(127, 0, 0, 2),
        Ipv4Addr::new(127, 0, 0, 3),
        Ipv4Addr::new(127, 0, 0, 4),
    );
    // limit-rpm 1 x multiplier 2: a burst of 2 per client, then 1 a minute; the denial is
    // tollgate's 429 where ingress-nginx answered 503.
    let first: Vec<u16> = (0..4).map(|_| from(a)).collect();
    assert_eq!(first, [200, 200, 429, 429]);
    assert_eq!(from(b), 200, "another client address has its own bucket");
    assert_eq!(from(b), 200);
    assert_eq!(from(b), 429);
    let exempt: Vec<u16> = (0..5).map(|_| from(whitelisted)).collect();
    assert_eq!(exempt, [200; 5], "limit-whitelist exempts its addresses");
    assert_eq!(stack.backend.count(), 2 + 2 + 5);

    // global-rate-limit 2 per hour keyed on the API key, whoever sends it; a request without
    // the key is keyed by its address, as ingress-nginx does with an empty key.
    let key = |source: Ipv4Addr, key: &str| send(source, "/api/items", &[("X-Api-Key", key)]);
    assert_eq!(key(a, "k-1"), 200);
    assert_eq!(key(b, "k-1"), 200);
    assert_eq!(key(a, "k-1"), 429, "one key, one bucket across addresses");
    assert_eq!(key(a, "k-2"), 200, "another key, its own bucket");
    let anonymous: Vec<u16> = (0..3).map(|_| send(b, "/api/items", &[])).collect();
    assert_eq!(anonymous, [200, 200, 429]);
    assert_eq!(
        send(a, "/api/items", &[]),
        200,
        "by address when the key is absent"
    );
}
