//! `tollgate top --admin URL [--admin URL...]`: the most denied keys over several instances,
//! in the terminal, refreshed every second until `q`.
//!
//! Each second every instance's `GET /v1/top` is fetched (plain HTTP/1.1, one connection per
//! fetch, a short timeout), rows are merged per (limit, key) and drawn on the alternate screen.
//! An instance that does not answer is listed as such. The terminal is put in raw mode only
//! while the view runs and restored on every way out.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long one instance may take to answer before it is shown as unreachable.
const FETCH_TIMEOUT: Duration = Duration::from_millis(800);
const REFRESH: Duration = Duration::from_secs(1);
/// Widest key shown; longer ones end in `…`.
const KEY_WIDTH: usize = 44;

#[derive(clap::Args, Clone, Debug)]
pub struct TopArgs {
    /// Admin listener of an instance, e.g. http://10.0.0.5:9090 (repeat for each instance)
    #[arg(long = "admin", required = true)]
    pub admins: Vec<String>,
    /// The window: 1m, 5m or 15m
    #[arg(long, default_value = "1m")]
    pub window: String,
    /// Rows to show at most
    #[arg(short, long, default_value_t = 20)]
    pub n: usize,
    /// Admin token, to see key values instead of fingerprints
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print one frame and exit (no terminal handling)
    #[arg(long)]
    pub once: bool,
}

/// One merged row: a key of a limit over every instance that answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub limit: String,
    pub key: String,
    pub denied: u64,
    pub per_min: f64,
    /// Of the limit's denials over the instances that answered.
    pub share: f64,
}

/// What one instance said, or why it said nothing.
pub type Answer = Result<Value, String>;

/// Runs the view until `q` (or once); an error only when the terminal cannot be used.
pub fn run(args: &TopArgs) -> io::Result<()> {
    let path = format!("/v1/top?window={}&n=100", args.window);
    let frame = || {
        let answers: Vec<(String, Answer)> = args
            .admins
            .iter()
            .map(|admin| (admin.clone(), fetch(admin, &path, args.token.as_deref())))
            .collect();
        render(&args.window, &answers, args.n, terminal_width())
    };
    if args.once {
        print!("{}", frame());
        return io::stdout().flush();
    }
    let _raw = RawMode::enter()?;
    let mut out = io::stdout();
    write!(out, "\x1b[?1049h\x1b[?25l")?;
    let result = (|| loop {
        let started = Instant::now();
        let text = frame().replace('\n', "\r\n");
        write!(out, "\x1b[H\x1b[2J{text}")?;
        out.flush()?;
        if quit_pressed(REFRESH.saturating_sub(started.elapsed()))? {
            return Ok(());
        }
    })();
    write!(out, "\x1b[?25h\x1b[?1049l")?;
    out.flush()?;
    result
}

/// Merges the instances' answers per (limit, key), most denied first.
pub fn merge(answers: &[(String, Answer)]) -> Vec<Row> {
    let mut rows: HashMap<(String, String), (u64, f64)> = HashMap::new();
    let mut totals: HashMap<String, u64> = HashMap::new();
    for answer in answers
        .iter()
        .filter_map(|(_, answer)| answer.as_ref().ok())
    {
        for limit in answer["limits"].as_array().into_iter().flatten() {
            let name = limit["limit"].as_str().unwrap_or("?").to_string();
            *totals.entry(name.clone()).or_default() += limit["denied"].as_u64().unwrap_or(0);
            for key in limit["keys"].as_array().into_iter().flatten() {
                let parts: Vec<&str> = key["key"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                let row = rows.entry((name.clone(), parts.join("|"))).or_default();
                row.0 += key["denied"].as_u64().unwrap_or(0);
                row.1 += key["denied_per_min"].as_f64().unwrap_or(0.0);
            }
        }
    }
    let mut rows: Vec<Row> = rows
        .into_iter()
        .map(|((limit, key), (denied, per_min))| Row {
            share: tollgate_core::base::rate::ratio(
                denied,
                totals.get(&limit).copied().unwrap_or(1),
            ),
            limit,
            key,
            denied,
            per_min,
        })
        .collect();
    rows.sort_by(|a, b| {
        b.denied
            .cmp(&a.denied)
            .then_with(|| a.limit.cmp(&b.limit))
            .then_with(|| a.key.cmp(&b.key))
    });
    rows
}

/// One screen: a title, the instances that did not answer, the table.
pub fn render(window: &str, answers: &[(String, Answer)], n: usize, width: usize) -> String {
    let up = answers.iter().filter(|(_, a)| a.is_ok()).count();
    let mut screen = format!(
        "tollgate top - denied most, last {window} - {up}/{} instance(s) answering - q quits\n",
        answers.len()
    );
    for (admin, answer) in answers {
        if let Err(why) = answer {
            screen.push_str(&clip(&format!("unreachable: {admin} ({why})"), width));
            screen.push('\n');
        }
    }
    screen.push('\n');
    screen.push_str(&format!(
        "{:<KEY_WIDTH$}  {:<20}  {:>10}  {:>6}\n",
        "KEY", "LIMIT", "DENIED/MIN", "SHARE"
    ));
    let rows = merge(answers);
    if rows.is_empty() {
        screen.push_str("(no denials in the window)\n");
    }
    for row in rows.iter().take(n) {
        let line = format!(
            "{:<KEY_WIDTH$}  {:<20}  {:>10.1}  {:>5.1}%",
            clip(&row.key, KEY_WIDTH),
            clip(&row.limit, 20),
            row.per_min,
            row.share * 100.0
        );
        screen.push_str(&clip(&line, width));
        screen.push('\n');
    }
    screen
}

fn clip(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut clipped: String = text.chars().take(width.saturating_sub(1)).collect();
    clipped.push('…');
    clipped
}

/// `GET path` from an admin URL (`http://host:port` or `host:port`), the body as JSON.
pub fn fetch(admin: &str, path: &str, token: Option<&str>) -> Answer {
    let authority = admin
        .strip_prefix("http://")
        .unwrap_or(admin)
        .trim_end_matches('/');
    if admin.starts_with("https://") || authority.contains('/') {
        return Err("expected http://host:port".into());
    }
    let addr = authority
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    let mut stream = TcpStream::connect_timeout(&addr, FETCH_TIMEOUT).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(FETCH_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(FETCH_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    let bearer = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\n{bearer}Connection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP answer")?;
    let status = head.split(' ').nth(1).unwrap_or("?");
    if status != "200" {
        return Err(format!("HTTP {status}"));
    }
    serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))
}

/// Waits up to `wait` for a key; true if it was `q` (or the input closed).
fn quit_pressed(wait: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut poll = libc::pollfd {
            fd: io::stdin().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd, for the length given.
        let ready = unsafe { libc::poll(&mut poll, 1, millis) };
        if ready <= 0 {
            return Ok(false);
        }
        let mut byte = [0u8; 1];
        match io::stdin().read(&mut byte)? {
            0 => return Ok(true),
            _ if byte[0] == b'q' || byte[0] == b'Q' || byte[0] == 3 => return Ok(true),
            _ => {}
        }
    }
}

/// Terminal columns, 100 when unknown.
fn terminal_width() -> usize {
    // SAFETY: winsize is plain integers; all zeroes is a valid value.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ fills the winsize it is given, which outlives the call.
    let ok = unsafe { libc::ioctl(io::stdout().as_raw_fd(), libc::TIOCGWINSZ, &mut size) } == 0;
    if ok && size.ws_col > 0 {
        usize::from(size.ws_col)
    } else {
        100
    }
}

/// Keys arrive one by one, unechoed, while the view runs; the old settings come back on drop.
struct RawMode {
    saved: Option<libc::termios>,
}

impl RawMode {
    fn enter() -> io::Result<RawMode> {
        let fd = io::stdin().as_raw_fd();
        // SAFETY: termios is plain integers; all zeroes is a valid value.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr fills the termios it is given; failing means stdin is no terminal.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return Ok(RawMode { saved: None });
        }
        let mut raw = saved;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO);
        raw.c_cc[libc::VMIN] = 1;
        raw.c_cc[libc::VTIME] = 0;
        // SAFETY: a termios derived from the one the terminal gave.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RawMode { saved: Some(saved) })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            // SAFETY: the settings read at entry.
            unsafe { libc::tcsetattr(io::stdin().as_raw_fd(), libc::TCSANOW, saved) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn instance(limits: Value) -> Answer {
        Ok(json!({ "window": "1m", "covered_s": 60, "limits": limits }))
    }

    #[test]
    fn rows_are_merged_per_limit_and_key_over_instances() {
        let a = instance(json!([
            { "limit": "per-ip", "denied": 100, "keys": [
                { "key": ["203.0.113.9"], "denied": 80, "denied_per_min": 80.0, "share": 0.8 },
                { "key": ["198.51.100.1"], "denied": 20, "denied_per_min": 20.0, "share": 0.2 } ] },
            { "limit": "per-key", "denied": 0, "keys": [] }
        ]));
        let b = instance(json!([
            { "limit": "per-ip", "denied": 100, "keys": [
                { "key": ["203.0.113.9"], "denied": 100, "denied_per_min": 100.0, "share": 1.0 } ] },
            { "limit": "per-key", "denied": 10, "keys": [
                { "key": ["ab12", "GET"], "denied": 10, "denied_per_min": 10.0, "share": 1.0 } ] }
        ]));
        let rows = merge(&[("a".into(), a), ("b".into(), b)]);
        assert_eq!(rows.len(), 3);
        assert_eq!(
            rows[0],
            Row {
                limit: "per-ip".into(),
                key: "203.0.113.9".into(),
                denied: 180,
                per_min: 180.0,
                share: 0.9,
            }
        );
        assert_eq!((rows[2].key.as_str(), rows[2].share), ("ab12|GET", 1.0));
    }

    #[test]
    fn an_unreachable_instance_is_shown_not_fatal() {
        let screen = render(
            "1m",
            &[(
                "http://127.0.0.1:1".into(),
                Err("connection refused".into()),
            )],
            20,
            100,
        );
        assert!(screen.contains("0/1 instance(s)"), "{screen}");
        assert!(screen.contains("unreachable: http://127.0.0.1:1 (connection refused)"));
        assert!(screen.contains("(no denials in the window)"));
    }

    #[test]
    fn a_refused_port_is_an_error_not_a_panic() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        assert!(fetch(&format!("http://127.0.0.1:{port}"), "/v1/top", None).is_err());
        assert!(fetch("https://example.com", "/v1/top", None).is_err());
        assert!(fetch("not a url", "/v1/top", None).is_err());
    }
}
