//! The spellings a client can choose for one resource, folded into one, the way the proxies
//! route: what the limits match and key on cannot be dodged by spelling the same path or host
//! differently. Each function borrows its input when it is already normal (the common case)
//! and allocates only to rewrite.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

/// Parses an address as proxies write it: `1.2.3.4`, `1.2.3.4:80`, `::1`, `[::1]:80`,
/// `fe80::1%eth0` (the zone is dropped). IPv4-mapped IPv6 becomes IPv4.
pub fn parse_ip(raw: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(raw).ok()?.trim();
    if text.len() > 64 {
        return None;
    }
    let ip = if let Ok(ip) = text.parse::<IpAddr>() {
        ip
    } else if let Ok(sock) = text.parse::<SocketAddr>() {
        sock.ip()
    } else {
        let unbracketed = text
            .strip_prefix('[')
            .map_or(text, |t| t.split_once(']').map_or(t, |(inside, _)| inside));
        let without_zone = unbracketed
            .split_once('%')
            .map_or(unbracketed, |(ip, _)| ip);
        without_zone.parse::<IpAddr>().ok()?
    };
    Some(ip.to_canonical())
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// A header value as text: bytes outside visible ASCII (controls, space, DEL, >= 0x80) are
/// percent-encoded, so a value with odd bytes is still read, never skipped.
pub fn visible(raw: &[u8]) -> Cow<'_, str> {
    if raw.iter().all(|&b| is_visible(b)) {
        // Every byte is ASCII, so the slice is valid UTF-8.
        return Cow::Borrowed(std::str::from_utf8(raw).unwrap_or_default());
    }
    let mut out = String::with_capacity(raw.len() + 8);
    for &byte in raw {
        if is_visible(byte) {
            out.push(char::from(byte));
        } else {
            push_escape(&mut out, byte);
        }
    }
    Cow::Owned(out)
}

/// The path as limits see it: query and fragment removed; escapes of unreserved characters
/// decoded, other escapes in upper-case hex, a `%` that starts no escape written `%25`; runs of
/// `/` collapsed; dot segments removed (RFC 3986, "Remove Dot Segments"); always starting with `/`.
///
/// Slashes are collapsed before dot segments are removed, as nginx does (`/x//../a` is `/a`).
pub fn path(uri: Cow<'_, str>) -> Cow<'_, str> {
    let end = uri.find(['?', '#']).unwrap_or(uri.len());
    let uri = match uri {
        Cow::Borrowed(text) => Cow::Borrowed(&text[..end]),
        Cow::Owned(mut text) => {
            text.truncate(end);
            Cow::Owned(text)
        }
    };
    if is_normal_path(&uri) {
        return uri;
    }
    let decoded = decode_unreserved(&uri);
    let collapsed = collapse_slashes(&decoded);
    Cow::Owned(remove_dot_segments(&collapsed))
}

/// The host as limits see it: lower-case, without `:port`, without one trailing dot.
pub fn host(host: Cow<'_, str>) -> Cow<'_, str> {
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        return Cow::Owned(strip_trailing_dot(strip_port(&host)).to_ascii_lowercase());
    }
    match host {
        Cow::Borrowed(text) => Cow::Borrowed(strip_trailing_dot(strip_port(text))),
        Cow::Owned(text) => Cow::Owned(strip_trailing_dot(strip_port(&text)).to_string()),
    }
}

fn is_visible(byte: u8) -> bool {
    (0x21..=0x7e).contains(&byte)
}

fn push_escape(out: &mut String, byte: u8) {
    out.push('%');
    out.push(char::from(HEX_UPPER[usize::from(byte >> 4)]));
    out.push(char::from(HEX_UPPER[usize::from(byte & 0xf)]));
}

fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(byte: u8) -> Option<u8> {
    char::from(byte)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// True when [`path`] would return the input unchanged: it starts with `/` and holds no `%`,
/// no `//` and no `.` or `..` segment.
fn is_normal_path(path: &str) -> bool {
    let bytes = path.as_bytes();
    bytes.first() == Some(&b'/')
        && !bytes.contains(&b'%')
        && !path.contains("//")
        && path
            .split('/')
            .all(|segment| segment != "." && segment != "..")
}

/// Decodes escapes of unreserved characters; upper-cases the hex of the others; escapes a
/// `%` that starts no escape. The result holds only visible ASCII if the input did.
fn decode_unreserved(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(bytes.len() + 1);
    if bytes.first() != Some(&b'/') {
        out.push('/');
    }
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte != b'%' {
            out.push(char::from(byte));
            i += 1;
            continue;
        }
        let escape = bytes
            .get(i + 1..i + 3)
            .and_then(|pair| Some(hex_value(pair[0])? << 4 | hex_value(pair[1])?));
        match escape {
            Some(value) if is_unreserved(value) => out.push(char::from(value)),
            Some(value) => push_escape(&mut out, value),
            None => {
                out.push_str("%25");
                i += 1;
                continue;
            }
        }
        i += 3;
    }
    out
}

fn collapse_slashes(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if c == '/' && out.ends_with('/') {
            continue;
        }
        out.push(c);
    }
    out
}

/// RFC 3986's "Remove Dot Segments" for an absolute path without empty segments: `.` segments vanish, `..`
/// removes the segment before it (never above the root).
fn remove_dot_segments(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    let mut pieces = path.split('/').skip(1).peekable();
    let mut trailing_slash = false;
    while let Some(segment) = pieces.next() {
        let last = pieces.peek().is_none();
        match segment {
            "." => trailing_slash = last,
            ".." => {
                segments.pop();
                trailing_slash = last;
            }
            _ => {
                segments.push(segment);
                trailing_slash = false;
            }
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    // `/a/` keeps its last, empty segment; `/a/.` and `/a/b/..` end in `/` too.
    if trailing_slash && !segments.last().is_some_and(|s| s.is_empty()) || out.is_empty() {
        out.push('/');
    }
    out
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |i| &host[..=i]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.contains(':') => {
            name
        }
        _ => host,
    }
}

fn strip_trailing_dot(host: &str) -> &str {
    host.strip_suffix('.').unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn norm(raw: &str) -> String {
        path(visible(raw.as_bytes())).into_owned()
    }

    #[test]
    fn spellings_of_one_path_are_one_path() {
        for spelling in [
            "/api/items",
            "/%61pi/items",
            "/%61%70%69/items",
            "//api/items",
            "/api//items",
            "/./api/items",
            "/x/../api/items",
            "/%2e/api/items",
            "/%2E%2E/api/items",
            "/x/%2e%2e/api/items",
            "/x//../api/items",
            "/api/items?x=1",
            "/api/items#frag",
            "api/items",
        ] {
            assert_eq!(norm(spelling), "/api/items", "{spelling}");
        }
    }

    #[test]
    fn reserved_escapes_stay_escaped_in_upper_case() {
        assert_eq!(norm("/a%2fb"), "/a%2Fb");
        assert_eq!(norm("/a%3f?q"), "/a%3F");
        assert_eq!(norm("/%zz%"), "/%25zz%25");
        assert_eq!(norm("/caf\u{e9}"), "/caf%C3%A9");
    }

    #[test]
    fn dot_segments_keep_a_trailing_slash_and_never_climb_above_the_root() {
        assert_eq!(norm("/a/."), "/a/");
        assert_eq!(norm("/a/b/.."), "/a/");
        assert_eq!(norm("/a/"), "/a/");
        assert_eq!(norm("/../../a"), "/a");
        assert_eq!(norm("/.."), "/");
        assert_eq!(norm(""), "/");
        assert_eq!(norm("/a/.../b"), "/a/.../b");
    }

    #[test]
    fn a_normal_path_is_borrowed() {
        assert!(matches!(
            path(Cow::Borrowed("/api/v1/items?x=1")),
            Cow::Borrowed("/api/v1/items")
        ));
        assert!(matches!(
            host(Cow::Borrowed("api.example.com")),
            Cow::Borrowed(_)
        ));
        assert!(matches!(
            host(Cow::Borrowed("api.example.com.:80")),
            Cow::Borrowed("api.example.com")
        ));
        assert!(matches!(visible(b"/api"), Cow::Borrowed("/api")));
    }

    #[test]
    fn spellings_of_one_host_are_one_host() {
        for spelling in [
            "api.example.com",
            "API.Example.COM",
            "api.example.com.",
            "api.example.com:8080",
            "api.example.com.:80",
        ] {
            assert_eq!(
                host(Cow::Borrowed(spelling)),
                "api.example.com",
                "{spelling}"
            );
        }
        assert_eq!(host(Cow::Borrowed("[::1]:80")), "[::1]");
        assert_eq!(host(Cow::Borrowed("::1")), "::1");
    }

    #[test]
    fn odd_bytes_are_encoded_not_dropped() {
        assert_eq!(visible(b"/api/items?\xff=1"), "/api/items?%FF=1");
        assert_eq!(visible(b"a b\x7f"), "a%20b%7F");
    }

    fn raw_path() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            Just(b"/".to_vec()),
            Just(b".".to_vec()),
            Just(b"..".to_vec()),
            Just(b"%".to_vec()),
            Just(b"%2e".to_vec()),
            Just(b"%2F".to_vec()),
            Just(b"%61".to_vec()),
            Just(b"%aF".to_vec()),
            Just(b"?".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..3),
            "[a-fA-F0-9]{1,2}".prop_map(String::into_bytes),
        ];
        proptest::collection::vec(piece, 0..12).prop_map(|pieces| pieces.concat())
    }

    proptest! {
        #[test]
        fn path_normalisation_is_idempotent(raw in raw_path()) {
            let once = path(visible(&raw)).into_owned();
            let twice = path(Cow::Borrowed(&once)).into_owned();
            prop_assert_eq!(&twice, &once);
        }

        #[test]
        fn a_normalised_path_has_no_empty_or_dot_segments_nor_lower_case_escapes(raw in raw_path()) {
            let normal = path(visible(&raw)).into_owned();
            prop_assert!(normal.starts_with('/'));
            for bad in ["//", "/./", "/../"] {
                prop_assert!(!normal.contains(bad), "{:?} in {:?}", bad, normal);
            }
            prop_assert!(!normal.ends_with("/.") && !normal.ends_with("/.."), "{:?}", normal);
            let bytes = normal.as_bytes();
            for (i, _) in normal.match_indices('%') {
                let pair = bytes.get(i + 1..i + 3).unwrap_or_default();
                prop_assert!(
                    pair.len() == 2 && pair.iter().all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(b)),
                    "escape at {} in {:?}", i, normal
                );
                let value = u8::from_str_radix(std::str::from_utf8(pair).unwrap_or("00"), 16).unwrap_or(0);
                prop_assert!(!is_unreserved(value), "unreserved escape in {:?}", normal);
            }
        }
    }
}
