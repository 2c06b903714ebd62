//! What to put in front of tollgate instead of the TOML (`--proxy`).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::translate::Translation;

/// What can be put in front of tollgate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Proxy {
    /// nginx `auth_request` (plain nginx, or F5 NGINX Ingress snippets)
    Nginx,
    /// Traefik's ForwardAuth middleware
    Traefik,
    /// Envoy Gateway's SecurityPolicy (ext_authz over HTTP)
    Envoy,
}

/// What to put in front of tollgate for these Ingresses.
pub(super) fn snippet(proxy: Proxy, out: &Translation) -> String {
    let limited = &out.fronted;
    let mut text = String::new();
    match proxy {
        Proxy::Nginx => {
            text.push_str(
                "# nginx in front of tollgate: the shared parts (upstream tollgate, the internal\n\
                 # `location = /_tollgate` and `@tollgate_denied`) are in config/nginx/tollgate.conf\n\
                 # of the tollgate repository. Add to each location of these hosts and paths:\n",
            );
            for ingress in limited {
                for scope in &ingress.scopes {
                    let hosts = if scope.hosts.is_empty() {
                        "_".to_string()
                    } else {
                        scope.hosts.join(" ")
                    };
                    let path = scope.path_prefix.as_deref().unwrap_or("/");
                    let exact = if scope.exact { "= " } else { "" };
                    let _ = write!(
                        text,
                        "\n# {}\nserver {{\n    server_name {hosts};\n    location {exact}{path} {{\n        auth_request /_tollgate;\n        auth_request_set $tollgate_status $upstream_http_x_tollgate_status;\n        auth_request_set $tollgate_retry_after $upstream_http_retry_after;\n        error_page 403 = @tollgate_denied;\n        # proxy_pass to the Ingress's backend, as before\n    }}\n}}\n",
                        ingress.object
                    );
                }
            }
        }
        Proxy::Traefik => {
            text.push_str(
                "# Traefik in front of tollgate: one ForwardAuth middleware per namespace, and the\n\
                 # router annotation on each Ingress that had a limit.\n",
            );
            let namespaces: BTreeSet<&str> = limited.iter().map(|i| i.namespace.as_str()).collect();
            for namespace in &namespaces {
                let _ = write!(
                    text,
                    "---\napiVersion: traefik.io/v1alpha1\nkind: Middleware\nmetadata:\n  name: tollgate\n  namespace: {namespace}\nspec:\n  forwardAuth:\n    address: http://tollgate.tollgate.svc:8080/check   # CHANGE: tollgate's Service\n    trustForwardHeader: false\n    authResponseHeaders: [RateLimit, RateLimit-Policy, X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset]\n"
                );
            }
            for ingress in limited {
                let _ = write!(
                    text,
                    "# {}: add the annotation\n#   traefik.ingress.kubernetes.io/router.middlewares: {}-tollgate@kubernetescrd\n",
                    ingress.object, ingress.namespace
                );
            }
        }
        Proxy::Envoy => {
            text.push_str(
                "# Envoy Gateway in front of tollgate: an HTTP ext_authz SecurityPolicy on the\n\
                 # HTTPRoute that replaced each Ingress (rename targetRefs to the route's name).\n",
            );
            for ingress in limited {
                let _ = write!(
                    text,
                    "---\napiVersion: gateway.envoyproxy.io/v1alpha1\nkind: SecurityPolicy\nmetadata:\n  name: {}-tollgate\n  namespace: {}\nspec:\n  targetRefs:\n  - group: gateway.networking.k8s.io\n    kind: HTTPRoute\n    name: {}\n  extAuth:\n    failOpen: true\n    headersToExtAuth: [{}]\n    http:\n      backendRefs:\n      - name: tollgate          # CHANGE: tollgate's Service\n        namespace: tollgate\n        port: 8080\n      path: /check\n",
                    ingress.name,
                    ingress.namespace,
                    ingress.name,
                    std::iter::once("x-forwarded-for")
                        .chain(ingress.headers.iter().map(String::as_str))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
    }
    if limited.is_empty() {
        text.push_str("# No Ingress with a rate-limit annotation: nothing to put in front.\n");
    }
    text
}
