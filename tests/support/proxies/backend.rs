//! The application behind the proxy, which records what reaches it, and a client that
//! chooses its loopback source address.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use socket2::{Domain, Socket, Type};

use crate::support::Response;

/// One request the backend received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Header names lowercase.
    pub headers: Vec<(String, String)>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The application behind the proxy: answers every request `200 ok` and records it.
pub struct Backend {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

/// Extra header lines (each ending in CRLF) a backend adds to its answer to a request with
/// these headers.
type Answer = Arc<dyn Fn(&[(String, String)]) -> String + Send + Sync>;

impl Backend {
    pub fn start() -> Backend {
        Backend::start_answering(Arc::new(|_| String::new()))
    }

    /// An auth service in front of tollgate: answers `X-Plan: <plan>` for the API keys in
    /// `plans` (and no X-Plan for others), as a real auth layer would from its customer data.
    pub fn plan_service(plans: &[(&str, &str)]) -> Backend {
        let plans: Vec<(String, String)> = plans
            .iter()
            .map(|(k, p)| (k.to_string(), p.to_string()))
            .collect();
        Backend::start_answering(Arc::new(move |headers| {
            let key = headers.iter().find(|(n, _)| n == "x-api-key");
            key.and_then(|(_, key)| plans.iter().find(|(k, _)| k == key))
                .map_or(String::new(), |(_, plan)| format!("X-Plan: {plan}\r\n"))
        }))
    }

    fn start_answering(answer: Answer) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind backend");
        let addr = listener.local_addr().expect("backend address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (seen, stop, answer) = (seen2.clone(), stop2.clone(), answer.clone());
                std::thread::spawn(move || serve_backend_connection(stream, &seen, &stop, &answer));
            }
        });
        Backend { addr, seen, stop }
    }

    /// How many requests reached the application so far.
    pub fn count(&self) -> usize {
        self.seen.lock().map_or(0, |s| s.len())
    }

    /// Forgets what was received so far (a proxy's readiness probe, say).
    pub fn forget(&self) {
        if let Ok(mut list) = self.seen.lock() {
            list.clear();
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Keep-alive HTTP/1.1: reads requests (draining any Content-Length body) and answers each.
fn serve_backend_connection(
    stream: TcpStream,
    seen: &Mutex<Vec<Seen>>,
    stop: &AtomicBool,
    extra: &Answer,
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    while !stop.load(Ordering::SeqCst) {
        // Bytes, not UTF-8 lines: a request with bytes above ASCII must be counted too.
        let Some(line) = read_line_lossy(&mut reader) else {
            return;
        };
        let mut parts = line.split_whitespace();
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let mut headers = Vec::new();
        loop {
            let Some(header) = read_line_lossy(&mut reader) else {
                return;
            };
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
            }
        }
        let length: u64 = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let _ = std::io::copy(&mut (&mut reader).take(length), &mut std::io::sink());
        let close = headers
            .iter()
            .any(|(n, v)| n == "connection" && v.eq_ignore_ascii_case("close"));
        let extra = extra(&headers);
        if let Ok(mut list) = seen.lock() {
            list.push(Seen {
                method: method.to_string(),
                path: path.to_string(),
                headers,
            });
        }
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{extra}Content-Length: 8\r\n\r\nbackend\n"
        );
        if writer.write_all(answer.as_bytes()).is_err() || close {
            return;
        }
    }
}

/// One line, bytes above ASCII replaced; `None` at the end of the stream or on an error.
fn read_line_lossy(reader: &mut impl BufRead) -> Option<String> {
    let mut bytes = Vec::new();
    match reader.read_until(b'\n', &mut bytes) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(String::from_utf8_lossy(&bytes).into_owned()),
    }
}

/// One request on a fresh connection from `source` (any 127.x.y.z address: all of 127/8 is
/// loopback on Linux), with `Connection: close`; the whole answer is read.
pub fn send_from(
    source: Ipv4Addr,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Response> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.bind(&SocketAddr::new(IpAddr::V4(source), 0).into())?;
    socket.connect_timeout(&addr.into(), Duration::from_secs(2))?;
    let mut stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: app.example\r\nConnection: close\r\n");
    for (name, value) in headers {
        raw.push_str(&format!("{name}: {value}\r\n"));
    }
    if method == "POST" || method == "PUT" {
        raw.push_str("Content-Length: 4\r\n\r\nbody");
    } else {
        raw.push_str("\r\n");
    }
    stream.write_all(raw.as_bytes())?;
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes)?;
    let _ = stream.shutdown(Shutdown::Both);
    parse_response(&bytes)
}

/// One request given as raw bytes (request line, headers, body: anything, even bytes no client
/// library would send), on a fresh connection from `source`; the whole answer is read.
pub fn send_raw_from(
    source: Ipv4Addr,
    addr: SocketAddr,
    request: &[u8],
) -> std::io::Result<Response> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.bind(&SocketAddr::new(IpAddr::V4(source), 0).into())?;
    socket.connect_timeout(&addr.into(), Duration::from_secs(2))?;
    let mut stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(request)?;
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes)?;
    let _ = stream.shutdown(Shutdown::Both);
    parse_response(&bytes)
}

/// `send_from` the default client address, 127.0.0.1.
pub fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    send_from(Ipv4Addr::LOCALHOST, addr, method, path, headers)
        .unwrap_or_else(|e| panic!("{method} {path} via {addr}: {e}"))
}

fn parse_response(bytes: &[u8]) -> std::io::Result<Response> {
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| invalid("no header end"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid("bad status line"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Response {
        status,
        headers,
        body: body.to_string(),
    })
}

/// Counts the statuses of `responses`: (2xx, 429, other).
pub fn tally(statuses: &[u16]) -> (usize, usize, usize) {
    let ok = statuses.iter().filter(|s| (200..300).contains(*s)).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    (ok, limited, statuses.len() - ok - limited)
}

/// Fires `n` requests at once, spread over `addrs`, each from its own thread and connection;
/// returns the statuses.
pub fn burst_through(addrs: &[SocketAddr], n: usize, headers: &[(&str, &str)]) -> Vec<u16> {
    let barrier = Arc::new(std::sync::Barrier::new(n));
    let owned: Vec<(String, String)> = headers
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let (addr, barrier, owned) = (addrs[i % addrs.len()], barrier.clone(), owned.clone());
            std::thread::spawn(move || {
                let headers: Vec<(&str, &str)> = owned
                    .iter()
                    .map(|(a, b)| (a.as_str(), b.as_str()))
                    .collect();
                barrier.wait();
                send_from(Ipv4Addr::LOCALHOST, addr, "GET", "/burst", &headers)
                    .map_or(0, |r| r.status)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap_or(0)).collect()
}
