//! Writing the TOML: the `[response]` a denied client sees, the `[[exempt]]` rules and the
//! `[[limits]]` each Ingress becomes, and the notes of what is not carried.

use ipnet::IpNet;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use super::keys::{nginx_key, KeyError, KeyPlan};
use super::objects::{
    quoted, status_code, Controller, Ingress, IngressImportError, Scope, DEFAULT_BURST_MULTIPLIER,
    DEFAULT_GLOBAL_STATUS, DEFAULT_LIMIT_REQ_STATUS,
};

/// Everything the Ingresses become.
#[derive(Default)]
pub(super) struct Translation {
    /// `[response]`, with its comments.
    pub(super) response: String,
    exempts: String,
    pub(super) limits: String,
    pub(super) notes: Vec<String>,
    pub(super) names: HashSet<String>,
    /// The Ingresses that got a limit, in order, and their scopes.
    pub(super) fronted: Vec<Fronted>,
}

impl Translation {
    pub(super) fn toml(&self) -> String {
        let mut text = String::from(
            "# Converted from ingress-nginx annotations by `tollgate import ingress-nginx`.\n\
             # Put tollgate in front with `--proxy nginx|traefik|envoy`; check these limits on\n\
             # your own access log with `tollgate replay --config FILE LOG` before switching.\n\
             # ingress-nginx kept each limit per controller replica; tollgate keeps it once for\n\
             # all instances (backend = \"redis\"), so clients get the number written here.\n",
        );
        if self.fronted.is_empty() {
            text.push_str("\n# No rate-limit annotation found: no limits.\nlimits = []\n");
        }
        text.push_str(&self.response);
        text.push_str(&self.exempts);
        text.push_str(&self.limits);
        text
    }

    fn note(&mut self, object: &str, what: String) -> String {
        self.notes.push(format!("{object}: {what}"));
        what
    }

    /// `deny_status` from `limit-req-status-code` (annotation or ConfigMap, default 503) and
    /// `global-rate-limit-status-code` (ConfigMap, default 429): one status for all limits,
    /// and a 4xx. Every other status is named, with what clients see instead.
    pub(super) fn status(
        &mut self,
        ingresses: &[Ingress],
        controller: &Controller,
    ) -> Result<(), IngressImportError> {
        // (status, where it came from), in order of appearance.
        let mut wanted: Vec<(u16, String)> = Vec::new();
        for ingress in ingresses {
            if ingress.has_local_limits()? {
                let status = match ingress.annotation("limit-req-status-code") {
                    Some(text) => {
                        let status = status_code(text)
                            .map_err(|why| ingress.error("limit-req-status-code", why))?;
                        (status, format!("{} limit-req-status-code", ingress.object))
                    }
                    None => controller.limit_req_status.clone().map_or_else(
                        || {
                            (
                                DEFAULT_LIMIT_REQ_STATUS,
                                "ingress-nginx's default limit-req-status-code".to_string(),
                            )
                        },
                        |(status, from)| (status, format!("{from} limit-req-status-code")),
                    ),
                };
                wanted.push(status);
            }
            if ingress.has_global_limit()? {
                wanted.push(controller.global_status.clone().map_or_else(
                    || {
                        (
                            DEFAULT_GLOBAL_STATUS,
                            "ingress-nginx's default global-rate-limit-status-code".to_string(),
                        )
                    },
                    |(status, from)| (status, format!("{from} global-rate-limit-status-code")),
                ));
            }
        }
        let chosen = wanted
            .iter()
            .map(|(status, _)| *status)
            .find(|s| (400..=499).contains(s))
            .unwrap_or(429);
        let mut text = format!("\n[response]\ndeny_status = {chosen}\n");
        let mut seen = HashSet::new();
        for (status, from) in wanted {
            if status == chosen || !seen.insert((status, from.clone())) {
                continue;
            }
            let change = if (500..=599).contains(&status) {
                format!(
                    "clients that got {status} now get {chosen}, with Retry-After, RateLimit \
                     and X-RateLimit-* headers and a problem+json body; a client or monitor \
                     that retried or alerted on 5xx now sees a 4xx"
                )
            } else {
                format!(
                    "clients that got {status} now get {chosen} (one deny_status for all limits)"
                )
            };
            let what = self.note(
                "response.deny_status",
                format!("{from} was {status}: {change}"),
            );
            let _ = writeln!(text, "# {what}");
        }
        self.response = text;
        Ok(())
    }

    /// A unique limit or rule name `<namespace>-<name>-<what>`, `[a-z0-9_-]`, at most 64.
    fn name(&mut self, ingress: &Ingress, what: &str) -> String {
        let base: String = format!("{}-{}", ingress.namespace, ingress.name)
            .chars()
            .map(|c| match c.to_ascii_lowercase() {
                c @ ('a'..='z' | '0'..='9' | '_' | '-') => c,
                _ => '-',
            })
            .collect();
        // Room for "-<what>" and a numeric suffix should the name be taken.
        let room = 64 - what.len() - 1 - 3;
        let base = if base.len() > room {
            let digest = Sha256::digest(base.as_bytes());
            let tag: String = digest[..3].iter().map(|b| format!("{b:02x}")).collect();
            format!("{}-{tag}", &base[..room - 7])
        } else {
            base
        };
        let mut name = format!("{base}-{what}");
        let mut n = 2;
        while !self.names.insert(name.clone()) {
            name = format!("{base}-{what}{n}");
            n += 1;
        }
        name
    }

    pub(super) fn ingress(&mut self, ingress: &Ingress) -> Result<(), IngressImportError> {
        let object = ingress.object.clone();
        let prefix = ingress.prefix.as_str();
        let scopes = ingress.scopes();
        let mut comments: Vec<String> = Vec::new();
        for (annotation, why) in [
            (
                "limit-connections",
                "concurrent connections per client: tollgate has no concurrency limit for \
                 /check yet",
            ),
            ("limit-rate", "bandwidth (bytes per second), not requests"),
            (
                "limit-rate-after",
                "bandwidth (bytes per second), not requests",
            ),
        ] {
            if let Some(value) = ingress.annotation(annotation) {
                let what = self.note(
                    &object,
                    format!("{prefix}{annotation}: {value:?} not carried: {why}"),
                );
                comments.push(what);
            }
        }
        let rps = ingress.integer("limit-rps")?.unwrap_or(0);
        let rpm = ingress.integer("limit-rpm")?.unwrap_or(0);
        let multiplier = match ingress.integer("limit-burst-multiplier")? {
            Some(0) if rps > 0 || rpm > 0 => {
                // nginx's burst 0 admits one request at a time: tollgate's burst 1 does too.
                let what = self.note(
                    &object,
                    format!(
                        "{prefix}limit-burst-multiplier 0: nginx's burst 0 admits one request at \
                         a time, which is tollgate's burst 1"
                    ),
                );
                comments.push(what);
                0
            }
            Some(m) => m,
            None => DEFAULT_BURST_MULTIPLIER,
        };
        // `limit-allowlist` is the current name, `limit-whitelist` its older alias.
        let whitelist = if ingress.annotation("limit-allowlist").is_some() {
            ingress.cidrs("limit-allowlist")?
        } else {
            ingress.cidrs("limit-whitelist")?
        };
        let global = self.global(ingress, &mut comments)?;
        let ignored = ingress.cidrs("global-rate-limit-ignored-cidrs")?;
        let local = rps > 0 || rpm > 0;

        if scopes.len() > 1 && (local || global.is_some()) {
            comments.push(self.note(
                &object,
                format!(
                    "routes {} paths: one limit per path, each with its own buckets \
                     (ingress-nginx shared one zone across the Ingress's paths)",
                    scopes.len()
                ),
            ));
        }
        if local && global.is_some() && whitelist != ignored {
            comments.push(
                self.note(
                    &object,
                    "limit-whitelist and global-rate-limit-ignored-cidrs differ: tollgate's \
                 [[exempt]] skips every limit, so each list also skips the other kind of limit"
                        .into(),
                ),
            );
        }
        let mut block = format!("\n# ---- {object}\n");
        for comment in &comments {
            let _ = writeln!(block, "# {comment}");
        }
        for scope in &scopes {
            for note in scope.notes() {
                if local || global.is_some() {
                    let what = self.note(&object, note);
                    let _ = writeln!(block, "# {what}");
                }
            }
        }
        let mut emitted = false;
        let mut exempt_cidrs: Vec<IpNet> = Vec::new();
        if local {
            exempt_cidrs.extend(whitelist.iter().copied());
        } else if !whitelist.is_empty() {
            let _ = writeln!(
                block,
                "# {}",
                self.note(
                    &object,
                    format!(
                        "{prefix}limit-whitelist without limit-rps/limit-rpm: nothing to exempt"
                    )
                )
            );
        }
        if global.is_some() {
            for net in &ignored {
                if !exempt_cidrs.contains(net) {
                    exempt_cidrs.push(*net);
                }
            }
        }
        if !exempt_cidrs.is_empty() {
            for scope in &scopes {
                let name = self.name(ingress, "exempt");
                let nets: Vec<String> = exempt_cidrs
                    .iter()
                    .map(|n| quoted(&n.to_string()))
                    .collect();
                let _ = write!(
                    self.exempts,
                    "\n# {object}: limit-whitelist / global-rate-limit-ignored-cidrs\n[[exempt]]\nname = {}\ncidrs = [{}]\n{}",
                    quoted(&name),
                    nets.join(", "),
                    scope.lines()
                );
            }
        }
        for scope in &scopes {
            for (count, unit, what) in [(rps, "s", "rps"), (rpm, "min", "rpm")] {
                if count == 0 {
                    continue;
                }
                let name = self.name(ingress, what);
                let burst = count.saturating_mul(multiplier).max(1);
                let one_more = if multiplier > 0 {
                    " (nginx's limit_req admitted one more at once)"
                } else {
                    ""
                };
                let _ = write!(
                    block,
                    "\n[[limits]]   # limit-{what} {count} per client IP, burst {count} x {multiplier}{one_more}\n\
                     name = {}\nrate = \"{count}/{unit}\"\nburst = {burst}\nkey = [\"ip\"]\n",
                    quoted(&name)
                );
                match_table(&mut block, scope, &BTreeMap::new());
                emitted = true;
            }
            if let Some(global) = &global {
                self.global_limits(&mut block, ingress, scope, global);
                emitted = true;
            }
        }
        if emitted || !comments.is_empty() {
            self.limits.push_str(&block);
        }
        if emitted {
            let headers = global
                .iter()
                .flat_map(|g| g.key.parts.iter())
                .filter_map(|p| p.strip_prefix("header:"))
                .map(str::to_string)
                .collect();
            self.fronted.push(Fronted {
                headers,
                object,
                namespace: ingress.namespace.clone(),
                name: ingress.name.clone(),
                scopes,
            });
        }
        Ok(())
    }

    /// `global-rate-limit` and its companions; `None` when it is off (as in ingress-nginx: no
    /// limit, no window, or a window under a second).
    fn global(
        &mut self,
        ingress: &Ingress,
        comments: &mut Vec<String>,
    ) -> Result<Option<Global>, IngressImportError> {
        let object = ingress.object.clone();
        let prefix = ingress.prefix.as_str();
        let limit = ingress.integer("global-rate-limit")?.unwrap_or(0);
        let window = ingress.annotation("global-rate-limit-window");
        let Some(window) = window.filter(|_| limit > 0) else {
            if limit > 0 {
                comments.push(self.note(
                    &object,
                    format!(
                        "{prefix}global-rate-limit without global-rate-limit-window is off in \
                         ingress-nginx: not carried"
                    ),
                ));
            }
            return Ok(None);
        };
        let seconds = go_duration_secs(window)
            .map_err(|why| ingress.error("global-rate-limit-window", why))?;
        if seconds == 0 {
            comments.push(self.note(
                &object,
                format!(
                    "{prefix}global-rate-limit-window {window:?} is under a second, which \
                     ingress-nginx treats as off: not carried"
                ),
            ));
            return Ok(None);
        }
        let text = ingress
            .annotation("global-rate-limit-key")
            .unwrap_or("$remote_addr");
        let key = match nginx_key(text) {
            Ok(key) => key,
            Err(KeyError::Malformed(why)) => {
                return Err(ingress.error("global-rate-limit-key", why));
            }
            Err(KeyError::Unsupported(variable)) => {
                comments.push(self.note(
                    &object,
                    format!(
                        "{prefix}global-rate-limit-key {text:?}: ${variable} has no tollgate \
                         key part (ip, host, path, method, header:<name>, const:<text>): the \
                         global limit is not carried"
                    ),
                ));
                return Ok(None);
            }
        };
        if text.contains("request_uri") {
            comments.push(self.note(
                &object,
                "$request_uri includes the query string; tollgate's path part does not".into(),
            ));
        }
        Ok(Some(Global {
            limit,
            seconds,
            window: window.to_string(),
            key,
            key_text: text.to_string(),
        }))
    }

    fn global_limits(&mut self, block: &mut String, ingress: &Ingress, scope: &Scope, g: &Global) {
        let rate = rate_per(g.limit, g.seconds);
        let name = self.name(ingress, "global");
        let parts: Vec<String> = g.key.parts.iter().map(|p| quoted(p)).collect();
        let on_missing = if g.key.headers_only && g.key.parts.len() == 1 {
            ""
        } else if g.key.parts.iter().any(|p| p.starts_with("header:")) {
            // nginx interpolates an absent header as "": one shared value.
            "on_missing = \"anonymous\"\n"
        } else {
            ""
        };
        let _ = write!(
            block,
            "\n[[limits]]   # global-rate-limit {} per {} keyed {:?}\n\
             name = {}\nrate = {rate}\nburst = {}\nkey = [{}]\n{on_missing}",
            g.limit,
            g.window,
            g.key_text,
            quoted(&name),
            g.limit,
            parts.join(", ")
        );
        match_table(block, scope, &BTreeMap::new());
        if g.key.headers_only {
            // ingress-nginx keys a request whose key is empty by its client address.
            let fallback = self.name(ingress, "global-noheader");
            let headers: BTreeMap<String, Vec<String>> = g
                .key
                .parts
                .iter()
                .filter_map(|p| p.strip_prefix("header:"))
                .map(|h| (h.to_string(), vec![String::new()]))
                .collect();
            let _ = write!(
                block,
                "\n[[limits]]   # the same, for requests without {}: ingress-nginx keys them by $remote_addr\n\
                 name = {}\nrate = {rate}\nburst = {}\nkey = [\"ip\"]\n",
                headers.keys().cloned().collect::<Vec<_>>().join(" or "),
                quoted(&fallback),
                g.limit
            );
            match_table(block, scope, &headers);
        }
    }
}

pub(super) struct Fronted {
    /// Headers the limits key on, which Envoy must be told to send.
    pub(super) headers: Vec<String>,
    pub(super) object: String,
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) scopes: Vec<Scope>,
}

struct Global {
    limit: u64,
    seconds: u64,
    window: String,
    pub(super) key: KeyPlan,
    key_text: String,
}

/// `rate = ...` for `count` per `seconds`: an exact `"N/unit"` string when one exists, else
/// tokens per second.
pub(super) fn rate_per(count: u64, seconds: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(1, "s"), (60, "min"), (3600, "hour"), (86_400, "day")];
    if let Some((_, unit)) = UNITS.iter().find(|(unit_secs, _)| *unit_secs == seconds) {
        return format!("\"{count}/{unit}\"");
    }
    for (unit_secs, unit) in UNITS {
        let scaled = count.saturating_mul(unit_secs);
        if scaled % seconds == 0 {
            let per = scaled / seconds;
            return format!("\"{per}/{unit}\"   # {count} per {seconds} s");
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let per_second = count as f64 / seconds as f64;
    format!("{per_second:?}   # {count} per {seconds} s")
}

/// `[limits.match]` for a scope, plus header conditions.
fn match_table(block: &mut String, scope: &Scope, headers: &BTreeMap<String, Vec<String>>) {
    if scope.is_everything() && headers.is_empty() {
        return;
    }
    block.push_str("[limits.match]\n");
    block.push_str(&scope.lines());
    if !headers.is_empty() {
        let items: Vec<String> = headers
            .iter()
            .map(|(name, values)| {
                let values: Vec<String> = values.iter().map(|v| quoted(v)).collect();
                format!("{} = [{}]", quoted(name), values.join(", "))
            })
            .collect();
        let _ = writeln!(block, "headers = {{ {} }}", items.join(", "));
    }
}

/// Go's `time.ParseDuration` of an annotation (which ingress-nginx trims), in whole seconds
/// (it truncates the window so).
pub(super) fn go_duration_secs(text: &str) -> Result<u64, String> {
    tollgate_core::base::go::parse_duration(text.trim())
        .map(|window| window.as_secs())
        .ok_or_else(|| format!("{text:?} is not a duration like 1m, 30s or 1h30m"))
}
