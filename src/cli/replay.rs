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
use std::io::{BufRead, BufReader, Read};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use serde::de::{self, Deserializer as _, IgnoredAny, MapAccess, Visitor};
use serde::Serialize;

use crate::base::clock::ManualClock;
use crate::base::normalise::parse_ip;
use crate::config::{Config, ConfigError};
use crate::observe::metrics::Metrics;
use crate::observe::top;
use crate::policy::Policy;
use crate::request::OriginalRequest;
use crate::store::memory::MemoryStore;

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

/// One line's fields, borrowed from the line buffer where possible.
#[derive(Default)]
struct Fields<'l> {
    ip: Option<Cow<'l, str>>,
    time: Option<Cow<'l, str>>,
    method: Option<Cow<'l, str>>,
    path: Option<Cow<'l, str>>,
    host: Option<Cow<'l, str>>,
    headers: Vec<Option<Cow<'l, str>>>,
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

struct JsonFields {
    ip: String,
    time: String,
    method: String,
    path: String,
    host: String,
    headers: Vec<String>,
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
        buckets.retain(|bucket| !matches!(bucket.meter, crate::store::Meter::Lease(_)));
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
                        key: top::parts(top::tail_of(key, &self.policy.key_prefix, &limit.name))
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

/// The longest log line read; nginx's own lines are far shorter (its request line buffer is a
/// few KiB).
pub const MAX_LINE: usize = 64 * 1024;

enum Line {
    Read,
    TooLong,
    End,
}

/// One line (with its newline) into `line`, at most [`MAX_LINE`] bytes of it kept.
fn read_line(reader: &mut impl BufRead, line: &mut Vec<u8>) -> std::io::Result<Line> {
    let mut too_long = false;
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return Ok(match (line.is_empty() && !too_long, too_long) {
                (true, _) => Line::End,
                (false, true) => Line::TooLong,
                (false, false) => Line::Read,
            });
        }
        let (chunk, done) = match available.iter().position(|&b| b == b'\n') {
            Some(at) => (&available[..=at], true),
            None => (available, false),
        };
        let used = chunk.len();
        if !too_long && line.len() + used <= MAX_LINE {
            line.extend_from_slice(chunk);
        } else {
            too_long = true;
            line.clear();
        }
        reader.consume(used);
        if done {
            return Ok(if too_long { Line::TooLong } else { Line::Read });
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

/// `$remote_addr - $remote_user [$time_local] "$request" ...`: the address, the time and the
/// request line's method and URI (the rest is not needed).
fn combined(line: &[u8]) -> Option<Fields<'_>> {
    let line = std::str::from_utf8(line).ok()?;
    let (ip, rest) = line.split_once(' ')?;
    let open = rest.find('[')?;
    let rest = &rest[open + 1..];
    let (time, rest) = rest.split_once(']')?;
    let rest = rest.strip_prefix(" \"")?;
    let (request, _) = rest.split_once('"')?;
    let mut words = request.split(' ');
    let method = words.next().filter(|m| !m.is_empty())?;
    let path = words.next().filter(|p| p.starts_with('/'))?;
    Some(Fields {
        ip: Some(Cow::Borrowed(ip)),
        time: Some(Cow::Borrowed(time)),
        method: Some(Cow::Borrowed(method)),
        path: Some(Cow::Borrowed(path)),
        host: None,
        headers: Vec::new(),
    })
}

/// One JSON object; only the wanted fields are kept, borrowed when unescaped.
fn json<'l>(line: &'l [u8], names: &JsonFields) -> Option<Fields<'l>> {
    let mut deserializer = serde_json::Deserializer::from_slice(line);
    let fields = deserializer.deserialize_map(FieldsVisitor { names }).ok()?;
    deserializer.end().ok()?;
    Some(fields)
}

struct FieldsVisitor<'n> {
    names: &'n JsonFields,
}

impl<'de> Visitor<'de> for FieldsVisitor<'_> {
    type Value = Fields<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields<'de>, A::Error> {
        let names = self.names;
        let mut fields = Fields {
            headers: vec![None; names.headers.len()],
            ..Fields::default()
        };
        while let Some(key) = map.next_key::<Text<'de>>()? {
            let key = key.0;
            let slot = if key == names.ip {
                &mut fields.ip
            } else if key == names.time {
                &mut fields.time
            } else if key == names.method {
                &mut fields.method
            } else if key == names.path {
                &mut fields.path
            } else if key == names.host {
                &mut fields.host
            } else if let Some(i) = names.headers.iter().position(|h| *h == key) {
                &mut fields.headers[i]
            } else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            *slot = map.next_value::<Option<Text<'de>>>()?.map(|t| t.0);
        }
        Ok(fields)
    }
}

/// A JSON string (borrowed when it has no escapes) or number, as text.
struct Text<'de>(Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Text<'de> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(TextVisitor)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Text<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a string or a number")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
        Ok(Text(Cow::Borrowed(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Text<'de>, E> {
        Ok(Text(Cow::Owned(v.to_string())))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Text<'de>, E> {
        Ok(Text(Cow::Owned(v.to_string())))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Text<'de>, E> {
        Ok(Text(Cow::Owned(v.to_string())))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Text<'de>, E> {
        Ok(Text(Cow::Owned(format!("{v:.6}"))))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Text<'de>, E> {
        Ok(Text(Cow::Owned(v.to_string())))
    }
}

/// A log timestamp as Unix µs: `$time_local` (`10/Oct/2000:13:55:36 -0700`),
/// `$time_iso8601` (`2000-10-10T13:55:36-07:00`, fractions and `Z` accepted) or `$msec`
/// (`971211336.123`).
pub fn parse_time_us(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    if b.len() >= 20 && b.get(2) == Some(&b'/') {
        time_local(b)
    } else if b.len() >= 19 && b.get(4) == Some(&b'-') {
        iso8601(b)
    } else {
        epoch(text)
    }
}

fn digits(b: &[u8]) -> Option<i64> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
}

fn month(b: &[u8]) -> Option<i64> {
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let position = MONTHS.iter().position(|m| m.as_slice() == b)?;
    i64::try_from(position).ok().map(|m| m + 1)
}

/// Days from 1970-01-01 to a civil date (proleptic Gregorian).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn to_us(
    (year, month, day): (i64, i64, i64),
    (hour, minute, second): (i64, i64, i64),
    micros: i64,
    offset_s: i64,
) -> Option<u64> {
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let secs =
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    u64::try_from(secs.checked_mul(1_000_000)?.checked_add(micros)?).ok()
}

/// `+hhmm`, `+hh:mm`, `-...` or `Z`, in seconds east of UTC.
fn offset(b: &[u8]) -> Option<i64> {
    match b {
        b"Z" | b"z" => Some(0),
        [sign @ (b'+' | b'-'), h1, h2, rest @ ..] => {
            let minutes = match rest {
                [b':', m1, m2] | [m1, m2] => digits(&[*m1, *m2])?,
                [] => 0,
                _ => return None,
            };
            let total = digits(&[*h1, *h2])? * 3600 + minutes * 60;
            Some(if *sign == b'-' { -total } else { total })
        }
        _ => None,
    }
}

fn time_local(b: &[u8]) -> Option<u64> {
    // dd/Mon/yyyy:hh:mm:ss +zzzz
    if b.len() != 26 || b[2] != b'/' || b[6] != b'/' || b[11] != b':' || b[20] != b' ' {
        return None;
    }
    let date = (digits(&b[7..11])?, month(&b[3..6])?, digits(&b[0..2])?);
    let time = (
        digits(&b[12..14])?,
        digits(&b[15..17])?,
        digits(&b[18..20])?,
    );
    to_us(date, time, 0, offset(&b[21..])?)
}

fn iso8601(b: &[u8]) -> Option<u64> {
    // yyyy-mm-ddThh:mm:ss[.fff][zone]
    if b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let date = (digits(&b[0..4])?, digits(&b[5..7])?, digits(&b[8..10])?);
    let time = (
        digits(&b[11..13])?,
        digits(&b[14..16])?,
        digits(&b[17..19])?,
    );
    let mut rest = &b[19..];
    let mut micros = 0;
    if let Some(fraction) = rest.strip_prefix(b".") {
        let end = fraction
            .iter()
            .position(|c| !c.is_ascii_digit())
            .unwrap_or(fraction.len());
        let mut scaled = fraction[..end.min(6)].to_vec();
        scaled.resize(6, b'0');
        micros = digits(&scaled)?;
        rest = &fraction[end..];
    }
    let zone = if rest.is_empty() { 0 } else { offset(rest)? };
    to_us(date, time, micros, zone)
}

fn epoch(text: &str) -> Option<u64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let seconds = u64::try_from(digits(whole.as_bytes())?).ok()?;
    let mut micros = 0;
    if !fraction.is_empty() {
        let mut scaled = fraction.as_bytes()[..fraction.len().min(6)].to_vec();
        scaled.resize(6, b'0');
        micros = u64::try_from(digits(&scaled)?).ok()?;
    }
    seconds.checked_mul(1_000_000)?.checked_add(micros)
}

#[cfg(test)]
mod tests;
