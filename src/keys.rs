//! Every store key is built here: `<prefix>:<limit>:{<tail>}`, where the tail joins the limit's
//! key parts with `|`; plus [`instances_key`] for the instance registry.
//!
//! The braces are a Redis Cluster hash tag: only the tail picks the slot. So every limit keyed
//! on the same parts (say `per-ip-second` and `per-ip-minute`, both `key = ["ip"]`) keeps its
//! buckets of one client in one slot, and a request drawing from them is decided by one script
//! call, atomically, even on a Cluster. Different tails still spread over all slots, so no
//! shard gets hot from the layout. Outside a Cluster the braces are plain characters.
//!
//! Attacker-controlled values never reach the store raw. Inside a part, `%`, `|`, `#`, `{` and
//! `}` are percent-escaped, so two different part tuples can never produce the same tail, and a
//! client cannot move the hash tag (the prefix and limit names hold no braces: config
//! validation refuses them). A tail longer
//! than [`MAX_TAIL`] bytes, or holding bytes outside printable ASCII, is replaced by `#` and a
//! 128-bit SHA-256 prefix of itself: memory per bucket stays bounded whatever the client sends,
//! and a hashed tail cannot collide with a plain one (a plain `#` is always escaped).

use std::io::Write as _;
use std::net::IpAddr;

use sha2::{Digest, Sha256};

use crate::request::Described;

/// Longest tail stored as is.
pub const MAX_TAIL: usize = 128;

/// Marker written for an absent part under `on_missing = "anonymous"`; escaping guarantees no
/// real value produces it (a real `%` is written `%25`).
const ANONYMOUS: &[u8] = b"%anon";

/// One component of a limit's key, parsed from the config strings (`ip`, `header:x-api-key`...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    Ip,
    Method,
    Host,
    Path,
    /// Header name, lowercase.
    Header(String),
    Const(String),
}

impl KeyPart {
    pub fn parse(text: &str) -> Result<KeyPart, String> {
        match text {
            "ip" => return Ok(KeyPart::Ip),
            "method" => return Ok(KeyPart::Method),
            "host" => return Ok(KeyPart::Host),
            "path" => return Ok(KeyPart::Path),
            _ => {}
        }
        if let Some(name) = text.strip_prefix("header:") {
            return actix_web::http::header::HeaderName::try_from(name)
                .map(|h| KeyPart::Header(h.as_str().to_string()))
                .map_err(|_| format!("{name:?} is not a valid header name"));
        }
        if let Some(value) = text.strip_prefix("const:") {
            return Ok(KeyPart::Const(value.to_string()));
        }
        Err(format!(
            "unknown key part {text:?}: expected ip, method, host, path, header:<name> or const:<text>"
        ))
    }
}

impl std::fmt::Display for KeyPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyPart::Ip => f.write_str("ip"),
            KeyPart::Method => f.write_str("method"),
            KeyPart::Host => f.write_str("host"),
            KeyPart::Path => f.write_str("path"),
            KeyPart::Header(name) => write!(f, "header:{name}"),
            KeyPart::Const(text) => write!(f, "const:{text}"),
        }
    }
}

/// A key part the request does not carry (a missing or empty header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingPart;

/// Builds the bucket key of one limit for one request. With `anonymous`, absent parts become a
/// shared marker instead of an error.
pub fn bucket_key(
    prefix: &str,
    limit: &str,
    parts: &[KeyPart],
    request: &Described<'_>,
    anonymous: bool,
) -> Result<String, MissingPart> {
    let tail = bucket_tail(parts, request, anonymous)?;
    Ok(assemble(prefix, limit, &tail))
}

/// The request's values of `parts`, escaped and joined with `|`: what identifies its bucket
/// within a limit, before [`assemble`] hashes it if need be. Overrides are looked up by it.
pub fn bucket_tail(
    parts: &[KeyPart],
    request: &Described<'_>,
    anonymous: bool,
) -> Result<Vec<u8>, MissingPart> {
    let mut tail = Vec::with_capacity(64);
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            tail.push(b'|');
        }
        match part_value(part, request) {
            Some(PartValue::Bytes(value)) => escape_into(&mut tail, value),
            Some(PartValue::Lowercase(value)) => {
                let start = tail.len();
                escape_into(&mut tail, value);
                tail[start..].make_ascii_lowercase();
            }
            Some(PartValue::Ip(ip)) => write_ip(&mut tail, ip),
            None if anonymous => tail.extend_from_slice(ANONYMOUS),
            None => return Err(MissingPart),
        }
    }
    Ok(tail)
}

/// The tail a request carrying `values` (one per part, as an operator writes them in an
/// override) would have: IP addresses in canonical form, hosts lowercase. Fails with the
/// index of a value that no request can carry, and why.
pub fn tail_of_values(parts: &[KeyPart], values: &[String]) -> Result<Vec<u8>, (usize, String)> {
    let mut tail = Vec::with_capacity(64);
    for (i, (part, value)) in parts.iter().zip(values).enumerate() {
        if i > 0 {
            tail.push(b'|');
        }
        if value.is_empty() {
            return Err((i, "is empty: an empty value is a missing key part".into()));
        }
        match part {
            KeyPart::Ip => match crate::request::parse_ip(value.as_bytes()) {
                Some(ip) => write_ip(&mut tail, ip),
                None => return Err((i, format!("{value:?} is not an IP address"))),
            },
            KeyPart::Host => {
                let start = tail.len();
                escape_into(&mut tail, value.as_bytes());
                tail[start..].make_ascii_lowercase();
            }
            _ => escape_into(&mut tail, value.as_bytes()),
        }
    }
    Ok(tail)
}

/// The sorted set where instances announce themselves (`on_error = "local"`).
pub fn instances_key(prefix: &str) -> String {
    format!("{prefix}:instances")
}

/// `<prefix>:<limit>:{<tail>}`, hashing the tail when it is long or unprintable.
pub fn assemble(prefix: &str, limit: &str, tail: &[u8]) -> String {
    let printable = tail.iter().all(|b| (0x20..=0x7e).contains(b));
    let mut key = String::with_capacity(prefix.len() + limit.len() + 4 + tail.len().min(33));
    key.push_str(prefix);
    key.push(':');
    key.push_str(limit);
    key.push_str(":{");
    if printable && tail.len() <= MAX_TAIL {
        // Every byte was checked to be printable ASCII.
        key.push_str(std::str::from_utf8(tail).unwrap_or_default());
    } else {
        key.push('#');
        let digest = Sha256::digest(tail);
        for byte in &digest[..16] {
            key.push(char::from(HEX[usize::from(byte >> 4)]));
            key.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
    }
    key.push('}');
    key
}

const HEX: &[u8; 16] = b"0123456789abcdef";

enum PartValue<'a> {
    Bytes(&'a [u8]),
    Lowercase(&'a [u8]),
    Ip(IpAddr),
}

fn part_value<'a>(part: &'a KeyPart, request: &'a Described<'_>) -> Option<PartValue<'a>> {
    let value = match part {
        KeyPart::Ip => return Some(PartValue::Ip(request.client_ip)),
        KeyPart::Method => PartValue::Bytes(request.method.as_bytes()),
        KeyPart::Host => PartValue::Lowercase(request.host_without_port().as_bytes()),
        KeyPart::Path => PartValue::Bytes(request.path.as_bytes()),
        KeyPart::Header(name) => PartValue::Bytes(request.header(name)?),
        KeyPart::Const(text) => PartValue::Bytes(text.as_bytes()),
    };
    match value {
        PartValue::Bytes(b) | PartValue::Lowercase(b) if b.is_empty() => None,
        value => Some(value),
    }
}

fn escape_into(out: &mut Vec<u8>, value: &[u8]) {
    for &byte in value {
        match byte {
            b'%' => out.extend_from_slice(b"%25"),
            b'|' => out.extend_from_slice(b"%7C"),
            b'#' => out.extend_from_slice(b"%23"),
            b'{' => out.extend_from_slice(b"%7B"),
            b'}' => out.extend_from_slice(b"%7D"),
            _ => out.push(byte),
        }
    }
}

fn write_ip(out: &mut Vec<u8>, ip: IpAddr) {
    // Writing to a Vec cannot fail.
    let _ = write!(out, "{ip}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_printable_tails_are_kept_verbatim() {
        assert_eq!(
            assemble("tg", "per-ip", b"10.0.0.1"),
            "tg:per-ip:{10.0.0.1}"
        );
    }

    #[test]
    fn limits_on_the_same_parts_share_a_cluster_slot() {
        let slot = |key: &str| redis::cluster_routing::Slot::for_key(key);
        let second = assemble("tg", "per-ip-second", b"10.0.0.1");
        let minute = assemble("tg", "per-ip-minute", b"10.0.0.1");
        assert_eq!(slot(&second), slot(&minute));
        assert_ne!(
            slot(&second),
            slot(&assemble("tg", "per-ip-second", b"10.0.0.2"))
        );
    }

    #[test]
    fn braces_in_values_cannot_move_the_hash_tag() {
        let mut tail = Vec::new();
        escape_into(&mut tail, b"a}b{c");
        assert_eq!(tail, b"a%7Db%7Bc");
    }

    #[test]
    fn long_or_binary_tails_are_hashed_to_a_fixed_length() {
        let long = vec![b'a'; 10_000];
        let key = assemble("tg", "k", &long);
        assert_eq!(key.len(), "tg:k:{#}".len() + 32);
        let binary = assemble("tg", "k", b"\xff\x00abc");
        assert!(binary.starts_with("tg:k:{#"));
        assert_ne!(key, binary);
    }

    #[test]
    fn separators_inside_values_cannot_forge_another_tuple() {
        let mut a = Vec::new();
        escape_into(&mut a, b"x|y");
        let mut b = Vec::new();
        escape_into(&mut b, b"x");
        b.push(b'|');
        escape_into(&mut b, b"y");
        assert_ne!(a, b);
    }

    #[test]
    fn a_plain_value_cannot_impersonate_a_hashed_tail() {
        let mut out = Vec::new();
        escape_into(&mut out, b"#0123");
        assert!(out.starts_with(b"%23"));
    }

    #[test]
    fn key_parts_parse_and_print_back() {
        for text in [
            "ip",
            "method",
            "host",
            "path",
            "header:x-api-key",
            "const:all",
        ] {
            assert_eq!(KeyPart::parse(text).unwrap().to_string(), text);
        }
        assert!(KeyPart::parse("header:bad header").is_err());
        assert!(KeyPart::parse("cookie").is_err());
    }
}
