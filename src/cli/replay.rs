//! `tollgate replay --config FILE LOG...`: an access log run offline against a config, on the
//! memory store, with the log's own timestamps as the store's clock. Each line is decided as
//! `/check` would decide it on the memory store (exemptions, matching limits, one atomic
//! decision); per limit it reports the requests it would have denied, the keys denied most and
//! each one's first denial.
//!
//! Lines are read into one reused buffer and parsed in place: a line costs no allocation of its
//! own beyond what the policy and the store need for a decision. Memory stays bounded: the
//! store holds at most `max_buckets` buckets and each limit remembers at most `max_buckets`
//! denied keys (denials of further keys are counted, not listed).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufReader, Read};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Serialize;

use tollgate_core::base::clock::ManualClock;
use tollgate_core::base::normalise::parse_ip;
use tollgate_core::config::{Config, ConfigError};
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::observe::top;
use tollgate_core::policy::Policy;
use tollgate_core::request::OriginalRequest;
use tollgate_core::store::memory::MemoryStore;

mod log_line;
mod timestamp;

pub use log_line::MAX_LINE;
use log_line::{combined, json, read_line, Fields, JsonFields, Line};
pub use timestamp::parse_time_us;

/// How the log is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// nginx's `combined` (ingress-nginx's default `upstreaminfo` starts the same way)
    Combined,
    /// One JSON object per line; field names given by the --field-* flags
    Json,
}

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

/// The command line of `tollgate replay` (besides the global `--config`).
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// Access log files, read in order as one stream
    #[arg(required = true)]
    pub logs: Vec<PathBuf>,
    /// The log's format
    #[arg(long, value_enum, default_value = "combined")]
    pub log_format: LogFormat,
    /// The report's format
    #[arg(long, value_enum, default_value = "text")]
    pub format: OutputFormat,
    /// Keys listed per limit
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// The host of every request (a combined log does not record it); a JSON line's host
    /// field wins
    #[arg(long)]
    pub host: Option<String>,
    /// JSON: the client address field
    #[arg(long, default_value = "remote_addr")]
    pub field_ip: String,
    /// JSON: the time field ($time_local, $time_iso8601 or $msec, recognised by shape)
    #[arg(long, default_value = "time_local")]
    pub field_time: String,
    /// JSON: the method field
    #[arg(long, default_value = "request_method")]
    pub field_method: String,
    /// JSON: the URI field
    #[arg(long, default_value = "request_uri")]
    pub field_path: String,
    /// JSON: the host field
    #[arg(long, default_value = "host")]
    pub field_host: String,
    /// JSON: a request header the limits read, from a field: `x-api-key=http_x_api_key`
    #[arg(long = "field-header", value_name = "HEADER=FIELD")]
    pub field_headers: Vec<String>,
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("{0}: {1}")]
    Read(String, std::io::Error),
    #[error("--field-header {0:?}: expected HEADER=FIELD with a valid header name")]
    FieldHeader(String),
}

/// The report, as `--format json` prints it.
#[derive(Debug, Serialize, PartialEq)]
pub struct Report {
    pub requests: u64,
    pub unparsed: u64,
    /// Requests an `[[exempt]]` rule admitted.
    pub exempt: u64,
    /// Requests at least one limit denied.
    pub denied: u64,
    pub limits: Vec<LimitReport>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct LimitReport {
    pub name: String,
    /// A shadow limit's denials are counted, never enforced.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
    pub denied: u64,
    pub top: Vec<KeyReport>,
    /// Denials of keys beyond the `max_buckets` remembered ones (counted in `denied`).
    #[serde(skip_serializing_if = "is_zero")]
    pub keys_untracked: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Serialize, PartialEq)]
pub struct KeyReport {
    pub key: Vec<String>,
    pub denied: u64,
    /// The timestamp of the log line of its first denial, as written.
    pub first_denied: String,
}

/// The command: the report on stdout; a bad config or unreadable log: one line, exit 2.
pub fn run(config: Option<&Path>, args: &ReplayArgs) -> ExitCode {
    let Some(config) = config else {
        eprintln!("tollgate: replay: --config: the configuration to replay against is required");
        return ExitCode::from(2);
    };
    let result = Config::load(Some(config))
        .map_err(ReplayError::from)
        .and_then(|config| Replay::new(&config, args))
        .and_then(|mut replay| {
            for log in &args.logs {
                let file = std::fs::File::open(log)
                    .map_err(|e| ReplayError::Read(log.display().to_string(), e))?;
                replay
                    .read(file)
                    .map_err(|e| ReplayError::Read(log.display().to_string(), e))?;
            }
            Ok(replay.report(args.top))
        });
    match result {
        Ok(report) => {
            match args.format {
                OutputFormat::Json => {
                    println!("{}", serde_json::to_string(&report).unwrap_or_default());
                }
                OutputFormat::Text => print!("{}", text(&report)),
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("tollgate: replay: {error}");
            ExitCode::from(2)
        }
    }
}

fn text(report: &Report) -> String {
    let mut out = format!(
        "requests {}  denied {}  exempt {}  unparsed {}\n",
        report.requests, report.denied, report.exempt, report.unparsed
    );
    for limit in &report.limits {
        let shadow = if limit.shadow { " (shadow)" } else { "" };
        let _ = writeln!(
            out,
            "\nlimit {}{shadow}: {} denied",
            limit.name, limit.denied
        );
        for key in &limit.top {
            let _ = writeln!(
                out,
                "  {:>10}  {}  first denied {}",
                key.denied,
                key.key.join("|"),
                key.first_denied
            );
        }
        if limit.keys_untracked > 0 {
            let _ = writeln!(
                out,
                "  {:>10}  (keys beyond max_buckets, not listed)",
                limit.keys_untracked
            );
        }
    }
    out
}

/// Denials of one limit.
#[derive(Default)]
struct Tally {
    denied: u64,
    /// Store key -> (denials, timestamp of the first).
    keys: HashMap<String, (u64, String)>,
    untracked: u64,
}

/// The replay: the policy, the store on the log's clock, the tallies.
pub struct Replay {
    policy: Policy,
    store: MemoryStore<Arc<ManualClock>>,
    clock: Arc<ManualClock>,
    format: LogFormat,
    host: String,
    json: JsonFields,
    /// Reused for the headers of each line (JSON logs with --field-header).
    headers: HeaderMap,
    header_names: Vec<HeaderName>,
    /// The last time text parsed and its value: consecutive lines mostly share a second.
    last_time: (Vec<u8>, u64),
    max_keys: usize,
    requests: u64,
    unparsed: u64,
    exempt: u64,
    denied: u64,
    tallies: Vec<Tally>,
}

impl Replay {
    pub fn new(config: &Config, args: &ReplayArgs) -> Result<Replay, ReplayError> {
        let policy = Policy::compile(config, &Metrics::new())?;
        let clock = Arc::new(ManualClock::default());
        let mut header_names = Vec::new();
        let mut header_fields = Vec::new();
        for spec in &args.field_headers {
            let (name, field) = spec
                .split_once('=')
                .filter(|(n, f)| !n.is_empty() && !f.is_empty())
                .ok_or_else(|| ReplayError::FieldHeader(spec.clone()))?;
            let name = HeaderName::try_from(name.trim())
                .map_err(|_| ReplayError::FieldHeader(spec.clone()))?;
            header_names.push(name);
            header_fields.push(field.trim().to_string());
        }
        Ok(Replay {
            tallies: policy.limits.iter().map(|_| Tally::default()).collect(),
            policy,
            store: MemoryStore::with_clock(config.store.max_buckets, Arc::clone(&clock)),
            clock,
            format: args.log_format,
            host: args.host.clone().unwrap_or_default(),
            json: JsonFields {
                ip: args.field_ip.clone(),
                time: args.field_time.clone(),
                method: args.field_method.clone(),
                path: args.field_path.clone(),
                host: args.field_host.clone(),
                headers: header_fields,
            },
            headers: HeaderMap::new(),
            header_names,
            last_time: (Vec::new(), 0),
            max_keys: config.store.max_buckets.max(1),
            requests: 0,
            unparsed: 0,
            exempt: 0,
            denied: 0,
        })
    }

    /// Reads a whole log, line by line into one reused buffer. A line longer than
    /// [`MAX_LINE`] is skipped as unparsed, so a file without newlines cannot grow the buffer.
    pub fn read(&mut self, source: impl Read) -> std::io::Result<()> {
        let mut reader = BufReader::with_capacity(1 << 20, source);
        let mut line = Vec::with_capacity(4096);
        loop {
            line.clear();
            match read_line(&mut reader, &mut line)? {
                Line::End => return Ok(()),
                Line::TooLong => {
                    self.unparsed += 1;
                    continue;
                }
                Line::Read => {}
            }
            let text = line.strip_suffix(b"\n").unwrap_or(&line);
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            self.line(text);
        }
    }

    /// Decides one log line; `Some(allowed)` when it was a request, `None` when unparsed.
    pub fn line(&mut self, line: &[u8]) -> Option<bool> {
        let fields = match self.format {
            LogFormat::Combined => combined(line),
            LogFormat::Json => json(line, &self.json),
        };
        let Some(fields) = fields else {
            self.unparsed += 1;
            return None;
        };
        let parsed = (|| {
            let ip = parse_ip(fields.ip.as_deref()?.as_bytes())?;
            let time = fields.time.as_deref()?;
            let at_us = self.time_us(time)?;
            Some((ip, at_us))
        })();
        let Some((ip, at_us)) = parsed else {
            self.unparsed += 1;
            return None;
        };
        self.requests += 1;
        self.clock.set_us(at_us);
        self.headers.clear();
        for (name, value) in self.header_names.iter().zip(&fields.headers) {
            if let Some(value) = value.as_deref() {
                if let Ok(value) = HeaderValue::from_str(value) {
                    self.headers.insert(name.clone(), value);
                }
            }
        }
        let allowed = self.decide(&fields, ip);
        Some(allowed)
    }

    fn decide(&mut self, fields: &Fields<'_>, ip: IpAddr) -> bool {
        let host = fields.host.as_deref().unwrap_or(&self.host);
        let request = OriginalRequest::described(
            &self.headers,
            fields.method.as_deref().unwrap_or("GET"),
            fields.path.as_deref().unwrap_or("/"),
            host,
            ip,
        );
        let time = fields.time.as_deref().unwrap_or("");
        if self.policy.exempt(&request).is_some() {
            self.exempt += 1;
            return true;
        }
        let mut buckets = match self.policy.applicable(&request) {
            Ok(buckets) => buckets,
            Err(limit) => {
                // on_missing = "deny": denied without a bucket.
                self.denied += 1;
                let tally = &mut self.tallies[limit];
                tally.denied += 1;
                note_key(tally, "(missing key)", time, self.max_keys);
                return false;
            }
        };
        // A log line says nothing of how long its request was in flight: concurrency limits
        // are not replayed (each lease would be held until it expired, denying what was not).
        buckets.retain(|bucket| bucket.meter.lease().is_none());
        if buckets.is_empty() {
            return true;
        }
        let decided = self.store.decide_sync(&buckets);
        for (bucket, outcome) in buckets.iter().zip(&decided.buckets) {
            if !outcome.enough {
                let tally = &mut self.tallies[bucket.limit];
                tally.denied += 1;
                note_key(tally, &bucket.key, time, self.max_keys);
            }
        }
        if !decided.allowed {
            self.denied += 1;
        }
        decided.allowed
    }

    /// A log timestamp as Unix µs; the last one parsed is remembered.
    fn time_us(&mut self, text: &str) -> Option<u64> {
        if self.last_time.0 == text.as_bytes() {
            return Some(self.last_time.1);
        }
        let us = parse_time_us(text)?;
        self.last_time.0.clear();
        self.last_time.0.extend_from_slice(text.as_bytes());
        self.last_time.1 = us;
        Some(us)
    }

    /// The report, with the `top` keys of each limit (most denied first; ties by first denial
    /// in log order is not kept: by key).
    pub fn report(&self, top_n: usize) -> Report {
        let limits = self
            .policy
            .limits
            .iter()
            .zip(&self.tallies)
            .map(|(limit, tally)| {
                let mut keys: Vec<(&String, &(u64, String))> = tally.keys.iter().collect();
                keys.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then_with(|| a.0.cmp(b.0)));
                let top = keys
                    .into_iter()
                    .take(top_n)
                    .map(|(key, (denied, first))| KeyReport {
                        key: top::parts(tollgate_core::base::keys::tail_in_key(
                            key,
                            &self.policy.key_prefix,
                            &limit.name,
                        ))
                        .into_iter()
                        .map(Cow::into_owned)
                        .collect(),
                        denied: *denied,
                        first_denied: first.clone(),
                    })
                    .collect();
                LimitReport {
                    name: limit.name.clone(),
                    shadow: limit.shadow,
                    denied: tally.denied,
                    top,
                    keys_untracked: tally.untracked,
                }
            })
            .collect();
        Report {
            requests: self.requests,
            unparsed: self.unparsed,
            exempt: self.exempt,
            denied: self.denied,
            limits,
        }
    }
}

fn note_key(tally: &mut Tally, key: &str, time: &str, max_keys: usize) {
    if let Some(entry) = tally.keys.get_mut(key) {
        entry.0 += 1;
    } else if tally.keys.len() < max_keys {
        tally.keys.insert(key.to_string(), (1, time.to_string()));
    } else {
        tally.untracked += 1;
    }
}

#[cfg(test)]
mod tests;
