//! A minimal blocking HTTP/1.1 client with keep-alive: enough to drive `/check` hard from many
//! threads without exhausting ephemeral ports, and to send headers no polite client would.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Header names lowercase, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub struct HttpClient {
    reader: BufReader<TcpStream>,
    addr: SocketAddr,
}

impl HttpClient {
    pub fn connect(addr: SocketAddr) -> std::io::Result<HttpClient> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.set_nodelay(true)?;
        Ok(HttpClient {
            reader: BufReader::new(stream),
            addr,
        })
    }

    pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> std::io::Result<Response> {
        self.request("GET", path, headers)
    }

    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> std::io::Result<Response> {
        let mut raw = Vec::with_capacity(256);
        write!(raw, "{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr)?;
        for (name, value) in headers {
            write!(raw, "{name}: {value}\r\n")?;
        }
        raw.extend_from_slice(b"\r\n");
        self.send_raw(&raw)
    }

    /// Sends bytes as they are (for malformed requests) and reads one response.
    pub fn send_raw(&mut self, raw: &[u8]) -> std::io::Result<Response> {
        self.reader.get_mut().write_all(raw)?;
        self.read_response()
    }

    fn read_response(&mut self) -> std::io::Result<Response> {
        let invalid =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed before a response",
            ));
        }
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| invalid("bad status line"))?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let trimmed = line.trim_end();
            if trimmed.is_empty() {
                break;
            }
            let (name, value) = trimmed
                .split_once(':')
                .ok_or_else(|| invalid("bad header"))?;
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
        let length: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body)?;
        Ok(Response {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

/// One request to the admin listener with a JSON `body`, and the admin token if `token`.
pub fn admin_json(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Response {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    HttpClient::connect(addr)
        .and_then(|mut client| client.send_raw(raw.as_bytes()))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}
