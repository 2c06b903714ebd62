//! What `tollgate validate` prints: the effective settings, exemptions and limits, with
//! every password redacted.

use serde::Serialize;

use super::{Backend, Charge, Config, DenialLogging, MatchConfig, StoreConfig};
use crate::base::rate::RateSpec;

impl Config {
    /// What `tollgate validate` prints: the effective settings and limits, passwords redacted.
    pub fn summary(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(out, "configuration ok");
        let _ = writeln!(out, "listen        {}", self.listen);
        let _ = writeln!(out, "admin_listen  {}", self.admin_listen);
        let _ = writeln!(
            out,
            "admin_hosts   IP literals, localhost{}",
            self.admin_hosts
                .iter()
                .map(|host| format!(", {host}"))
                .collect::<String>()
        );
        if let Some(grpc) = self.grpc_listen {
            let _ = writeln!(out, "grpc_listen   {grpc}");
        }
        if let Some(tls) = &self.grpc_tls {
            let clients = match (&tls.files.ca_file, &tls.client_san) {
                (None, _) => "any client".to_string(),
                (Some(_), None) => "clients with a certificate of client_ca_file".to_string(),
                (Some(_), Some(san)) => format!("clients with a certificate for {san}"),
            };
            let cert = tls
                .files
                .cert_file
                .as_ref()
                .map(|f| f.display().to_string());
            let _ = writeln!(out, "grpc_tls      {}, {clients}", cert.unwrap_or_default());
        }
        let _ = writeln!(out, "store         {}", self.store.describe());
        let _ = writeln!(out, "tracing       {}", self.tracing.describe());
        let _ = writeln!(
            out,
            "client_ip     from {}, trusted {:?}, ipv6 keyed per /{}",
            spelled(&self.client_ip.from),
            self.client_ip
                .trusted_proxies
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>(),
            self.client_ip.ipv6_prefix
        );
        if !self.exempt.is_empty() {
            let _ = writeln!(out, "exempt        {}", self.exempt.len());
            for rule in &self.exempt {
                let cidrs: Vec<String> = rule.cidrs.iter().map(|n| n.to_string()).collect();
                let matching = rule.matching();
                let conditions = match (cidrs.is_empty(), matching.is_empty()) {
                    (false, false) => format!("cidrs {cidrs:?}, {}", matching.describe()),
                    (false, true) => format!("cidrs {cidrs:?}"),
                    (true, _) => matching.describe(),
                };
                let _ = writeln!(out, "  {:<16} {conditions}", rule.name);
            }
        }
        let _ = writeln!(
            out,
            "admin_token   {}",
            match (&self.admin_token, &self.admin_token_file) {
                (Some(_), _) => "set".to_string(),
                (None, Some(path)) => format!("from {}", path.display()),
                (None, None) => "not set (POST /report is refused)".to_string(),
            }
        );
        let _ = writeln!(
            out,
            "fingerprints  {}",
            match (
                &self.fingerprint_salt,
                &self.fingerprint_salt_file,
                &self.admin_token,
                &self.admin_token_file,
            ) {
                (Some(_), ..) => "salted with fingerprint_salt".to_string(),
                (None, Some(path), ..) => format!("salted from {}", path.display()),
                (None, None, None, None) =>
                    "salted at random per process (set fingerprint_salt for stable ones)"
                        .to_string(),
                _ => "salted with a secret derived from the admin token".to_string(),
            }
        );
        let _ = writeln!(
            out,
            "log denials   {}",
            match self.log.denials {
                DenialLogging::Off => "off",
                DenialLogging::Sampled =>
                    "sampled (a JSON line per denied limit and key, at most every 10 s)",
            }
        );
        let _ = writeln!(out, "limits        {}", self.limits.len());
        for limit in &self.limits {
            let size = match (limit.quota, limit.period) {
                _ if limit.concurrency.is_some() => format!(
                    "concurrency {}  lease_ttl_s {}",
                    limit.capacity(),
                    limit
                        .lease_ttl_s
                        .unwrap_or(crate::config::DEFAULT_LEASE_TTL_S)
                ),
                (Some(quota), Some(period)) => format!("quota {quota} per {period}"),
                _ => format!("rate {}  burst {}", describe_rate(&limit.rate), limit.burst),
            };
            let _ = write!(
                out,
                "  {:<16} {size}  key [{}]  cost {}",
                limit.name,
                limit.key.join(", "),
                limit
                    .cost_header
                    .as_deref()
                    .map_or(limit.cost.to_string(), |h| format!(
                        "from {h} (default {})",
                        limit.cost
                    )),
            );
            if limit.shadow {
                out.push_str("  shadow");
            }
            if limit.borrow == Some(true) {
                out.push_str("  borrows");
            }
            if limit.charge == Charge::Report {
                let _ = write!(out, "  charged by /report (max_debt {})", limit.max_debt());
            }
            if limit.reserve.is_some() || limit.reserve_header.is_some() {
                let _ = write!(
                    out,
                    "  reserves {}{} for {} s, then {}",
                    limit.reserve.unwrap_or(1),
                    limit
                        .reserve_header
                        .as_deref()
                        .map_or(String::new(), |h| format!(" or {h}")),
                    limit
                        .reservation_ttl_s
                        .unwrap_or(crate::config::DEFAULT_RESERVATION_TTL_S),
                    match limit.on_reservation_expiry.unwrap_or_default() {
                        crate::config::ReservationExpiry::Keep => "keeps the estimate",
                        crate::config::ReservationExpiry::Refund => "refunds it",
                    }
                );
            }
            let _ = write!(
                out,
                "  on_missing {:?}  match {}",
                limit.on_missing,
                limit.matching.describe()
            );
            if !limit.overrides.is_empty() || limit.overrides_file.is_some() {
                let _ = write!(out, "  overrides {} inline", limit.overrides.len());
                if let Some(file) = &limit.overrides_file {
                    let _ = write!(out, " + file {}", file.display());
                }
            }
            out.push('\n');
        }
        if !self.envoy.is_empty() {
            let rules = crate::erl::config::all_rules(&self.envoy).unwrap_or_default();
            let mut domains: Vec<&str> = rules.iter().map(|r| r.domain.as_str()).collect();
            domains.sort_unstable();
            domains.dedup();
            let limited = rules.iter().filter(|r| r.rate_limit.is_some()).count();
            let _ = write!(
                out,
                "envoy rules   {} ({limited} with rate_limit) in domains [{}]",
                rules.len(),
                domains.join(", ")
            );
            if let Some(dir) = &self.envoy.config_dir {
                let _ = write!(out, "  config_dir {} (watched)", dir.display());
            }
            if let Some(xds) = &self.envoy.xds {
                let _ = write!(
                    out,
                    "  + xDS server {} as node {:?}",
                    xds.server, xds.node_id
                );
            }
            for (on, what) in [
                (self.envoy.shadow_mode, "global shadow_mode"),
                (self.envoy.quota_mode, "global quota_mode"),
                (self.envoy.merge_domains, "merged domains"),
                (self.envoy.response_headers, "ratelimit headers"),
            ] {
                if on {
                    let _ = write!(out, "  {what}");
                }
            }
            out.push('\n');
            out.push_str(&self.envoy.metrics.describe());
        }
        if !self.erl_env_read.is_empty() {
            let _ = writeln!(
                out,
                "envoyproxy/ratelimit environment  {} variables read",
                self.erl_env_read.len()
            );
            for (name, key) in &self.erl_env_read {
                let key = if key.is_empty() {
                    "(nothing: refused if it asks)"
                } else {
                    key
                };
                let _ = writeln!(out, "  {name:<44} {key}");
            }
        }
        if !self.rlqs.buckets.is_empty() {
            let rlqs = &self.rlqs;
            let _ = writeln!(
                out,
                "rlqs          {} bucket rule(s), unmatched {}, ttl {} s, reserve {}, abandon after {} s",
                rlqs.buckets.len(),
                spelled(&rlqs.unmatched),
                rlqs.assignment_ttl_s,
                rlqs.reserve,
                rlqs.abandon_after_s
            );
            for rule in &rlqs.buckets {
                let matching: Vec<String> = rule
                    .matching
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                let _ = writeln!(
                    out,
                    "  domain {}  match [{}]  -> limit {}  key [{}]",
                    rule.domain.as_deref().unwrap_or("any"),
                    matching.join(", "),
                    rule.limit,
                    rule.key.join(", ")
                );
            }
        }
        for warning in self.warnings() {
            let _ = writeln!(out, "warning: {warning}");
        }
        out
    }
}

/// `20/s`, or the written form and what it means per second: `100/min = 1.666667 tokens/s`.
fn describe_rate(rate: &RateSpec) -> String {
    match (rate, rate.per_second()) {
        (RateSpec::Text(text), Ok(per_second)) => {
            let fixed = format!("{per_second:.6}");
            let short = fixed.trim_end_matches('0').trim_end_matches('.');
            format!("{} = {short} tokens/s", text.trim())
        }
        _ => rate.to_string(),
    }
}

impl StoreConfig {
    /// One line for logs and `validate`: never the password.
    pub fn describe(&self) -> String {
        match self.backend {
            Backend::Memory => format!("memory (at most {} buckets)", self.max_buckets),
            Backend::Redis => {
                let target = if !self.cluster.is_empty() {
                    let seeds: Vec<String> = self.cluster.iter().map(|u| redact_url(u)).collect();
                    format!("cluster [{}]", seeds.join(", "))
                } else if let Some(sentinel) = &self.sentinel {
                    let urls: Vec<String> = sentinel.urls.iter().map(|u| redact_url(u)).collect();
                    format!(
                        "sentinel master {:?} via [{}]",
                        sentinel.master,
                        urls.join(", ")
                    )
                } else {
                    redact_url(&self.url)
                };
                let mut more = if self.borrow {
                    format!(
                        ", borrow on ({} to {} ms)",
                        self.borrow_horizon_ms, self.borrow_longest_horizon_ms
                    )
                } else {
                    String::new()
                };
                if self.coalesce_window_ms > 0 {
                    more += &format!(", calls gathered for {} ms", self.coalesce_window_ms);
                }
                format!(
                    "redis {target} (timeout {} ms, on_error {}, prefix {:?}, deny cache {}{more}; {})",
                    self.timeout_ms,
                    spelled(&self.on_error),
                    self.key_prefix,
                    if self.deny_cache { "on" } else { "off" },
                    self.describe_links()
                )
            }
        }
    }
}

impl MatchConfig {
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.hosts.is_empty() {
            parts.push(format!("hosts {:?}", self.hosts));
        }
        if !self.methods.is_empty() {
            parts.push(format!("methods {:?}", self.methods));
        }
        if let Some(prefix) = &self.path_prefix {
            parts.push(format!("path_prefix {prefix:?}"));
        }
        for (name, values) in &self.headers {
            parts.push(format!("{name} in {values:?}"));
        }
        if !self.domains.is_empty() {
            parts.push(format!("domains {:?}", self.domains));
        }
        if !self.descriptors.is_empty() {
            parts.push(format!("descriptors {:?}", self.descriptors));
        }
        if parts.is_empty() {
            "all requests".into()
        } else {
            parts.join(", ")
        }
    }
}

/// A config enum as the file spells it (`x-forwarded-for`, not `XForwardedFor`).
fn spelled(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(text)) => text,
        _ => String::from("?"),
    }
}

/// Replaces the password of a `scheme://user:password@host` URL, and a socket URL's
/// `pass=`, with `***`.
pub fn redact_url(url: &str) -> String {
    let url = redact_userinfo(url);
    match url.split_once('?') {
        Some((base, query)) => {
            let pairs: Vec<&str> = query
                .split('&')
                .map(|pair| {
                    if pair.starts_with("pass=") {
                        "pass=***"
                    } else {
                        pair
                    }
                })
                .collect();
            format!("{base}?{}", pairs.join("&"))
        }
        None => url,
    }
}

fn redact_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let authority_end = url[scheme_end..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| scheme_end + i);
    let Some(at) = url[scheme_end..authority_end]
        .rfind('@')
        .map(|i| scheme_end + i)
    else {
        return url.to_string();
    };
    let userinfo = &url[scheme_end..at];
    let user = userinfo.split(':').next().unwrap_or("");
    format!("{}{}:***{}", &url[..scheme_end], user, &url[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_url_hides_the_password_only() {
        assert_eq!(
            redact_url("redis://user:s3cret@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(redact_url("redis://:s3cret@host"), "redis://:***@host");
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
        assert_eq!(
            redact_url("redis+unix:///run/r.sock?user=u&pass=s3cret"),
            "redis+unix:///run/r.sock?user=u&pass=***"
        );
    }
}
