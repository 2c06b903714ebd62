//! The paced loads' HTTP/1.1 client (`regions_load`, `rlqs_load`): one request over a
//! keep-alive connection, opened again once when it broke, and its status read.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A keep-alive connection, opened at its first request.
pub type Connection = Option<(TcpStream, BufReader<TcpStream>)>;

/// Sends `ask` (a whole request) over `connection` to `addr`, opening it when needed and
/// once more when it broke; whether the answer was a 200, `None` when none came.
pub fn request(connection: &mut Connection, addr: SocketAddr, ask: &str) -> Option<bool> {
    for _ in 0..2 {
        if connection.is_none() {
            let stream = TcpStream::connect(addr).ok()?;
            stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            let reader = BufReader::new(stream.try_clone().ok()?);
            *connection = Some((stream, reader));
        }
        let (stream, reader) = connection.as_mut()?;
        if stream.write_all(ask.as_bytes()).is_err() {
            *connection = None;
            continue;
        }
        match status(reader) {
            Some(code) => return Some(code == 200),
            None => *connection = None,
        }
    }
    None
}

/// One response's status, its headers and Content-Length body read.
fn status(reader: &mut BufReader<TcpStream>) -> Option<u16> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let code = line.split(' ').nth(1)?.parse().ok()?;
    let mut length = 0usize;
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(code)
}
