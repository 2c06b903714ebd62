//! What `/check` reads: the original request's method, path, host and client IP, recovered
//! from the headers the ingress forwards. An already-normal request allocates nothing: every
//! value borrows from the check request unless it had to be rewritten.

use std::borrow::Cow;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::base::keys::{self, BadPart, KeyPart, PartValue, Source};
use crate::base::normalise::{self, parse_ip};
use crate::config::{ClientIpConfig, IpSource};

/// A request's headers as the protocol that carried them holds them, looked up by lowercase
/// name: each protocol lends its own map, so a check copies no header.
pub trait Headers: std::fmt::Debug + Sync {
    /// The first value of `name`.
    fn get(&self, name: &str) -> Option<&[u8]>;
    /// The `index`th value of `name` (0 is the first).
    fn nth(&self, name: &str, index: usize) -> Option<&[u8]>;
    /// How many values `name` has.
    fn count(&self, name: &str) -> usize;
}

/// The `http` crate's map: what the tests, `tollgate replay` and HTTP frameworks built on it
/// hold.
impl Headers for http::HeaderMap {
    fn get(&self, name: &str) -> Option<&[u8]> {
        http::HeaderMap::get(self, name).map(http::HeaderValue::as_bytes)
    }

    fn nth(&self, name: &str, index: usize) -> Option<&[u8]> {
        self.get_all(name)
            .iter()
            .nth(index)
            .map(http::HeaderValue::as_bytes)
    }

    fn count(&self, name: &str) -> usize {
        self.get_all(name).iter().count()
    }
}

/// How the client IP is found; compiled from `[client_ip]`.
#[derive(Debug, Clone)]
pub struct ClientIpPolicy {
    pub from: IpSource,
    pub trusted: Vec<IpNet>,
    /// The network length an IPv6 client is keyed by; the trusted-proxy walk ignores it.
    pub ipv6_prefix: u8,
}

impl From<&ClientIpConfig> for ClientIpPolicy {
    fn from(config: &ClientIpConfig) -> Self {
        ClientIpPolicy {
            from: config.from,
            trusted: config.trusted_proxies.clone(),
            ipv6_prefix: config.ipv6_prefix,
        }
    }
}

impl ClientIpPolicy {
    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client's address per `[client_ip]`: never missing, since the TCP peer is the
    /// fallback of every source.
    pub fn client_ip(&self, headers: &dyn Headers, peer: IpAddr) -> IpAddr {
        let peer = peer.to_canonical();
        match self.from {
            IpSource::Peer => peer,
            IpSource::XRealIp if self.is_trusted(peer) => {
                headers.get("x-real-ip").and_then(parse_ip).unwrap_or(peer)
            }
            IpSource::XRealIp => peer,
            IpSource::XForwardedFor => self.walk_forwarded_for(headers, peer),
        }
    }

    /// Walks `X-Forwarded-For` entries then the peer, right to left: the client is the first
    /// address not in `trusted_proxies`; an unparseable entry stops the walk at the address to
    /// its right; if all are trusted, the leftmost one. Only the entries walked are parsed, so a
    /// 1,000-hop header costs as much as the trusted hops in front of it.
    fn walk_forwarded_for(&self, headers: &dyn Headers, peer: IpAddr) -> IpAddr {
        if !self.is_trusted(peer) {
            return peer;
        }
        let mut client = peer;
        // Several X-Forwarded-For lines form one list, in order; walk them last to first.
        // (The header count is capped by the HTTP parser, so `nth` stays cheap.)
        let line_count = headers.count("x-forwarded-for");
        for index in (0..line_count).rev() {
            let Some(line) = headers.nth("x-forwarded-for", index) else {
                break;
            };
            for entry in line.rsplit(|&b| b == b',') {
                let entry = entry.trim_ascii();
                if entry.is_empty() {
                    continue;
                }
                let Some(ip) = parse_ip(entry) else {
                    return client;
                };
                client = ip;
                if !self.is_trusted(ip) {
                    return client;
                }
            }
        }
        client
    }
}

/// The original request, as described by the check request's headers, normalised the way
/// the proxies route (see `base/normalise.rs`): what every limit matches and keys on.
#[derive(Debug)]
pub struct OriginalRequest<'a> {
    /// As sent (bytes outside visible ASCII percent-encoded).
    pub method: Cow<'a, str>,
    /// Normalised path: no query or fragment, no dot segments, no doubled slashes.
    pub path: Cow<'a, str>,
    /// Normalised host: lower-case, no port, no trailing dot.
    pub host: Cow<'a, str>,
    pub client_ip: IpAddr,
    headers: &'a dyn Headers,
}

impl<'a> OriginalRequest<'a> {
    /// `check_method` and `check_path_tail` describe the check request itself: its method,
    /// and its path below `/check` (used when no header names the original).
    ///
    /// A present header is always used, whatever its bytes: a later source only stands in for
    /// an absent one, so a client cannot push a header out of the way with an odd byte.
    pub fn new(
        headers: &'a dyn Headers,
        check_method: &'a str,
        check_path_tail: &'a str,
        client_ip: IpAddr,
    ) -> OriginalRequest<'a> {
        let original_url = header_text(headers, "x-original-url").map(split_url);
        let method = header_text(headers, "x-forwarded-method")
            .or_else(|| header_text(headers, "x-original-method"))
            .unwrap_or(Cow::Borrowed(check_method));
        let path = header_text(headers, "x-forwarded-uri")
            .or_else(|| header_text(headers, "x-original-uri"))
            .or_else(|| original_url.as_ref().map(|(_, path)| path.clone()))
            .unwrap_or(Cow::Borrowed(check_path_tail));
        let host = header_text(headers, "x-forwarded-host")
            .or_else(|| original_url.and_then(|(host, _)| host))
            .or_else(|| header_text(headers, "host"))
            .unwrap_or(Cow::Borrowed(""));
        OriginalRequest {
            method,
            path: normalise::path(path),
            host: normalise::host(host),
            client_ip,
            headers,
        }
    }

    /// A request described by its parts directly (an access log line: `tollgate replay`),
    /// normalised exactly as [`OriginalRequest::new`] normalises the forwarded ones; `headers`
    /// holds only what the limits read besides (an API key, a tier).
    pub fn described(
        headers: &'a dyn Headers,
        method: &'a str,
        path: &'a str,
        host: &'a str,
        client_ip: IpAddr,
    ) -> OriginalRequest<'a> {
        OriginalRequest {
            method: normalise::visible(method.as_bytes()),
            path: normalise::path(normalise::visible(path.as_bytes())),
            host: normalise::host(normalise::visible(host.as_bytes())),
            client_ip,
            headers,
        }
    }

    /// The first value of a header, as bytes; `None` when absent.
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers.get(name)
    }

    /// This request's bucket tail in a limit keyed by `parts` (see [`keys::build_tail`]).
    pub fn bucket_tail(
        &self,
        parts: &[KeyPart],
        anonymous: bool,
        ipv6_prefix: u8,
    ) -> Result<Vec<u8>, BadPart> {
        let value_of = |part| self.part_value(part);
        keys::build_tail(parts, Source::Request(&value_of), anonymous, ipv6_prefix)
    }

    /// The request's value for one part. Method, host and path come normalised (lower-case
    /// host, canonical path), so every spelling of one resource shares one bucket.
    fn part_value<'s>(&'s self, part: &'s KeyPart) -> Option<PartValue<'s>> {
        let value = match part {
            KeyPart::Ip => return Some(PartValue::Ip(self.client_ip)),
            KeyPart::Method => self.method.as_bytes(),
            KeyPart::Host => self.host.as_bytes(),
            KeyPart::Path => self.path.as_bytes(),
            KeyPart::Header(name) => self.header(name)?,
            KeyPart::Const(text) => text.as_bytes(),
            // An HTTP request carries no descriptor.
            KeyPart::Descriptor(_) => return None,
        };
        (!value.is_empty()).then_some(PartValue::Bytes(value))
    }
}

/// A present header as text (trimmed, odd bytes percent-encoded); `None` only when absent.
fn header_text<'a>(headers: &'a dyn Headers, name: &str) -> Option<Cow<'a, str>> {
    headers
        .get(name)
        .map(|v| normalise::visible(v.trim_ascii()))
}

/// Splits `scheme://host[:port]/path?query` into host and path; a value starting with `/` is
/// only a path. Garbage yields an unusable host and a path that matches nothing surprising.
fn split_url(url: Cow<'_, str>) -> (Option<Cow<'_, str>>, Cow<'_, str>) {
    let Some(scheme_end) = url.find("://") else {
        return (None, url);
    };
    let rest = scheme_end + 3;
    let authority_end = url[rest..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| rest + i);
    let host_start = url[rest..authority_end]
        .rfind('@')
        .map_or(rest, |i| rest + i + 1);
    let path_is_rooted = url[authority_end..].starts_with('/');
    match url {
        Cow::Borrowed(text) => (
            Some(Cow::Borrowed(&text[host_start..authority_end])).filter(|h| !h.is_empty()),
            Cow::Borrowed(if path_is_rooted {
                &text[authority_end..]
            } else {
                "/"
            }),
        ),
        Cow::Owned(text) => (
            Some(Cow::<str>::Owned(
                text[host_start..authority_end].to_string(),
            ))
            .filter(|h| !h.is_empty()),
            Cow::Owned(if path_is_rooted {
                text[authority_end..].to_string()
            } else {
                "/".into()
            }),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{HeaderMap, HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn xff_policy(trusted: &[&str]) -> ClientIpPolicy {
        ClientIpPolicy {
            from: IpSource::XForwardedFor,
            trusted: trusted.iter().map(|t| t.parse().unwrap()).collect(),
            ipv6_prefix: 64,
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn forwarded_for_from_an_untrusted_peer_is_ignored() {
        let policy = xff_policy(&["127.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "6.6.6.6")]);
        assert_eq!(policy.client_ip(&h, ip("203.0.113.9")), ip("203.0.113.9"));
    }

    #[test]
    fn the_rightmost_untrusted_hop_is_the_client() {
        let policy = xff_policy(&["127.0.0.0/8", "10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.1.2.3")]);
        assert_eq!(policy.client_ip(&h, ip("127.0.0.1")), ip("198.51.100.7"));
    }

    #[test]
    fn several_forwarded_for_lines_form_one_list() {
        let policy = xff_policy(&["127.0.0.0/8", "10.0.0.0/8"]);
        let h = headers(&[
            ("x-forwarded-for", "198.51.100.7"),
            ("x-forwarded-for", "10.0.0.2"),
        ]);
        assert_eq!(policy.client_ip(&h, ip("127.0.0.1")), ip("198.51.100.7"));
    }

    #[test]
    fn all_trusted_yields_the_leftmost() {
        let policy = xff_policy(&["10.0.0.0/8", "127.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "10.0.0.9, 10.0.0.2")]);
        assert_eq!(policy.client_ip(&h, ip("127.0.0.1")), ip("10.0.0.9"));
    }

    #[test]
    fn garbage_stops_the_walk_at_the_address_to_its_right() {
        let policy = xff_policy(&["10.0.0.0/8", "127.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "6.6.6.6, not-an-ip, 10.0.0.2")]);
        assert_eq!(policy.client_ip(&h, ip("127.0.0.1")), ip("10.0.0.2"));
    }

    #[test]
    fn ipv6_is_canonical_and_ports_and_zones_are_dropped() {
        assert_eq!(parse_ip(b"2001:DB8:0::1"), Some(ip("2001:db8::1")));
        assert_eq!(parse_ip(b"[2001:db8::1]:443"), Some(ip("2001:db8::1")));
        assert_eq!(parse_ip(b"fe80::1%eth0"), Some(ip("fe80::1")));
        assert_eq!(parse_ip(b"::ffff:192.0.2.1"), Some(ip("192.0.2.1")));
        assert_eq!(parse_ip(b"192.0.2.1:8080"), Some(ip("192.0.2.1")));
        assert_eq!(parse_ip(b"\xff\xfe"), None);
    }

    #[test]
    fn real_ip_is_honoured_only_from_a_trusted_peer() {
        let policy = ClientIpPolicy {
            from: IpSource::XRealIp,
            trusted: vec!["127.0.0.0/8".parse().unwrap()],
            ipv6_prefix: 64,
        };
        let h = headers(&[("x-real-ip", "198.51.100.7")]);
        assert_eq!(policy.client_ip(&h, ip("127.0.0.1")), ip("198.51.100.7"));
        assert_eq!(policy.client_ip(&h, ip("203.0.113.1")), ip("203.0.113.1"));
    }

    #[test]
    fn original_request_is_read_in_order_of_preference() {
        let h = headers(&[
            ("x-original-method", "POST"),
            ("x-original-uri", "/api/v1/items?page=2"),
            ("host", "tollgate:8080"),
            ("x-original-url", "https://api.example.com:8443/other"),
        ]);
        let d = OriginalRequest::new(&h, "GET", "/", ip("127.0.0.1"));
        assert_eq!(d.method, "POST");
        assert_eq!(d.path, "/api/v1/items");
        assert_eq!(d.host, "api.example.com");
    }

    #[test]
    fn the_check_path_describes_the_request_when_no_header_does() {
        let h = headers(&[("host", "Example.com")]);
        let d = OriginalRequest::new(&h, "DELETE", "/items/7", ip("127.0.0.1"));
        assert_eq!(
            (&*d.method, &*d.path, &*d.host),
            ("DELETE", "/items/7", "example.com")
        );
    }

    fn raw_headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn a_header_with_bytes_above_ascii_is_read_not_skipped() {
        let h = raw_headers(&[
            ("x-forwarded-uri", b"/api/items?\xff=1"),
            ("x-original-uri", b"/public"),
            ("x-forwarded-host", b"API.example.com.:443"),
        ]);
        let d = OriginalRequest::new(&h, "GET", "/", ip("127.0.0.1"));
        assert_eq!(d.path, "/api/items");
        assert_eq!(d.host, "api.example.com");
        let h = raw_headers(&[("x-forwarded-uri", b"/api/\xc3\xa9")]);
        let d = OriginalRequest::new(&h, "GET", "/", ip("127.0.0.1"));
        assert_eq!(d.path, "/api/%C3%A9");
    }

    #[test]
    fn an_empty_header_is_present_and_later_sources_do_not_replace_it() {
        let h = headers(&[("x-forwarded-uri", ""), ("x-original-uri", "/api/items")]);
        let d = OriginalRequest::new(&h, "GET", "/api/x", ip("127.0.0.1"));
        assert_eq!(d.path, "/");
    }

    #[test]
    fn the_original_url_is_normalised_like_the_others() {
        let h = headers(&[(
            "x-original-url",
            "http://user@API.example.com.:80//%61pi/./items?x",
        )]);
        let d = OriginalRequest::new(&h, "GET", "/", ip("127.0.0.1"));
        assert_eq!((&*d.host, &*d.path), ("api.example.com", "/api/items"));
        let h = headers(&[("x-original-url", "/x/../api")]);
        let d = OriginalRequest::new(&h, "GET", "/", ip("127.0.0.1"));
        assert_eq!(d.path, "/api");
    }

    #[test]
    fn an_already_normal_request_borrows_every_value() {
        let h = headers(&[
            ("x-forwarded-method", "POST"),
            ("x-forwarded-uri", "/api/items?page=2"),
            ("x-forwarded-host", "api.example.com:443"),
        ]);
        let d = OriginalRequest::new(&h, "GET", "/", ip("127.0.0.1"));
        assert!(matches!(d.method, Cow::Borrowed("POST")));
        assert!(matches!(d.path, Cow::Borrowed("/api/items")));
        assert!(matches!(d.host, Cow::Borrowed("api.example.com")));
    }

    /// What an operator types for each part keys the bucket a request carrying those values
    /// is keyed by: peeks and resets name the bucket `/check` uses.
    #[test]
    fn given_values_key_the_bucket_of_a_request_carrying_them() {
        let parts = [
            KeyPart::Ip,
            KeyPart::Header("x-api-key".into()),
            KeyPart::Host,
            KeyPart::Path,
            KeyPart::Method,
        ];
        let long = "k".repeat(300);
        #[rustfmt::skip]
        let cases: &[[&str; 5]] = &[
            ["203.0.113.9", "plain", "example.com", "/a", "GET"],
            ["2001:db8:1:2:aaaa::1", "a|b%7C{x}#", "Example.COM.", "/a/./b//c/../d", "POST"],
            ["::ffff:192.0.2.1", long.as_str(), "api.example.com", "/%7euser", "DELETE"],
            ["192.0.2.1", "caf\u{e9}", "h", "/", "GET"],
        ];
        for case in cases {
            let mut headers = HeaderMap::new();
            let values: Vec<String> = case.iter().map(|v| v.to_string()).collect();
            let set = |headers: &mut HeaderMap, name: &'static str, value: &str| {
                headers.insert(
                    HeaderName::from_static(name),
                    HeaderValue::from_bytes(value.as_bytes()).unwrap(),
                );
            };
            set(&mut headers, "x-api-key", case[1]);
            set(&mut headers, "x-forwarded-host", case[2]);
            set(&mut headers, "x-forwarded-uri", case[3]);
            set(&mut headers, "x-forwarded-method", case[4]);
            let ip = parse_ip(case[0].as_bytes()).unwrap();
            let request = OriginalRequest::new(&headers, "GET", "/", ip);
            let checked = request.bucket_tail(&parts, false, 64).unwrap();
            let given = keys::build_tail(&parts, Source::Typed(&values), false, 64).unwrap();
            assert_eq!(given, checked, "{case:?}");
        }
    }

    #[test]
    fn an_empty_given_value_is_the_anonymous_bucket_only_under_anonymous() {
        let parts = [KeyPart::Header("x-api-key".into())];
        let headers = HeaderMap::new();
        let request = OriginalRequest::new(&headers, "GET", "/", "192.0.2.1".parse().unwrap());
        let checked = request.bucket_tail(&parts, true, 64).unwrap();
        let given = keys::build_tail(&parts, Source::Typed(&[String::new()]), true, 64).unwrap();
        assert_eq!(given, checked);
        assert!(keys::build_tail(&parts, Source::Typed(&[String::new()]), false, 64).is_err());
    }

    proptest::proptest! {
        /// A header or const value an operator types (an override, a peek, a report) keys
        /// the bucket of a request that carries it, whatever its bytes.
        #[test]
        fn any_header_value_given_keys_the_request_s_bucket(
            value in "[ -~]{1,80}",
            anonymous: bool,
        ) {
            let value = value.trim().to_string();
            proptest::prop_assume!(!value.is_empty());
            let parts = [KeyPart::Header("x-api-key".into()), KeyPart::Const("all".into())];
            let mut headers = HeaderMap::new();
            headers.insert(
                HeaderName::from_static("x-api-key"),
                HeaderValue::from_str(&value).unwrap(),
            );
            let request = OriginalRequest::new(&headers, "GET", "/", "192.0.2.1".parse().unwrap());
            let checked = request.bucket_tail(&parts, anonymous, 64).unwrap();
            let given = keys::build_tail(&parts, Source::Typed(&[value, "all".into()]), anonymous, 64).unwrap();
            proptest::prop_assert_eq!(given, checked);
        }
    }
}
