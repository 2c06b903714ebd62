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
//! validation refuses them). A tail longer than [`MAX_TAIL`] bytes, or holding bytes outside
//! printable ASCII, is replaced by `#` and a 128-bit SHA-256 prefix of itself: memory per
//! bucket stays bounded whatever the client sends, and a hashed tail cannot collide with a
//! plain one (a plain `#` is always escaped).

use std::borrow::Cow;
use std::io::Write as _;
use std::net::IpAddr;

use ipnet::Ipv6Net;

use sha2::{Digest, Sha256};

use crate::base::normalise;

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
    /// The value of this entry key in an Envoy rate limit descriptor (gRPC only).
    Descriptor(String),
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
            return http::HeaderName::try_from(name)
                .map(|h| KeyPart::Header(h.as_str().to_string()))
                .map_err(|_| format!("{name:?} is not a valid header name"));
        }
        if let Some(value) = text.strip_prefix("const:") {
            return Ok(KeyPart::Const(value.to_string()));
        }
        if let Some(key) = text.strip_prefix("descriptor:") {
            if key.is_empty() {
                return Err(
                    "descriptor: needs an entry key, e.g. descriptor:remote_address".into(),
                );
            }
            return Ok(KeyPart::Descriptor(key.to_string()));
        }
        Err(format!(
            "unknown key part {text:?}: expected ip, method, host, path, header:<name>, const:<text> or descriptor:<key>"
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
            KeyPart::Descriptor(key) => write!(f, "descriptor:{key}"),
        }
    }
}

/// The key tail of a store key `<prefix>:<limit>:{<tail>}`; the whole key if it is not one.
pub fn tail_in_key<'k>(key: &'k str, prefix: &str, limit: &str) -> &'k str {
    key.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix(':'))
        .and_then(|rest| rest.strip_prefix(limit))
        .and_then(|rest| rest.strip_prefix(":{"))
        .and_then(|rest| rest.strip_suffix('}'))
        .unwrap_or(key)
}

/// Where the values of a limit's key parts come from. Whatever the source, [`build_tail`]
/// spells one tuple of values one way, so an override or a peek typed by an operator finds
/// the bucket a request or a descriptor carrying the same values draws from.
pub enum Source<'s, 'v> {
    /// A request's value of each part, as `/check` reads it (already normalised).
    Request(&'s dyn Fn(&'v KeyPart) -> Option<PartValue<'v>>),
    /// Values typed by an operator (an override, a peek, a report), one per part in order:
    /// normalised as a request's are (an IP address in canonical form; a host lower-case
    /// without port or trailing dot; a path canonical); an empty one is an absent part.
    Typed(&'s [String]),
    /// A gRPC descriptor's value of each part, keyed as Envoy sends it; empty is absent.
    Descriptor(&'s dyn Fn(&'v KeyPart) -> Option<&'v [u8]>),
    /// An envoyproxy/ratelimit rule's values, one per entry of its path, in order, keyed as
    /// sent; empty is absent. The rule is keyed on its path: `parts` is not read.
    Entries(&'s mut dyn Iterator<Item = &'v [u8]>),
}

/// A part that gives no key: absent (without `anonymous`), or a typed value no request can
/// carry. `index` is the part's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadPart {
    pub index: usize,
    pub why: Cow<'static, str>,
}

/// The values of `parts` from `source`, escaped and joined with `|`: what identifies a
/// bucket within a limit, before [`assemble`] hashes it if need be. Overrides are looked up
/// by it. Every source of values builds its tail here, so one key is spelled one way. With
/// `anonymous`, an absent part becomes a shared marker instead of an error; an IPv6 address
/// is keyed by its `/ipv6_prefix` network.
pub fn build_tail<'v>(
    parts: &'v [KeyPart],
    source: Source<'_, 'v>,
    anonymous: bool,
    ipv6_prefix: u8,
) -> Result<Vec<u8>, BadPart> {
    let mut tail = Vec::with_capacity(64);
    let mut push = |index: usize, value: Option<PartValue<'_>>| -> Result<(), BadPart> {
        if index > 0 {
            tail.push(b'|');
        }
        match value {
            Some(PartValue::Bytes(value)) => escape_into(&mut tail, value),
            Some(PartValue::Ip(ip)) => write_ip(&mut tail, ip, ipv6_prefix),
            None if anonymous => tail.extend_from_slice(ANONYMOUS),
            None => {
                return Err(BadPart {
                    index,
                    why: Cow::Borrowed("is empty: an empty value is a missing key part"),
                })
            }
        }
        Ok(())
    };
    let present = |value: &'v [u8]| (!value.is_empty()).then_some(PartValue::Bytes(value));
    match source {
        Source::Request(value_of) => {
            for (index, part) in parts.iter().enumerate() {
                push(index, value_of(part))?;
            }
        }
        Source::Descriptor(value_of) => {
            for (index, part) in parts.iter().enumerate() {
                push(index, value_of(part).and_then(present))?;
            }
        }
        Source::Entries(values) => {
            for (index, value) in values.enumerate() {
                push(index, present(value))?;
            }
        }
        Source::Typed(values) => {
            for (index, (part, value)) in parts.iter().zip(values).enumerate() {
                if value.is_empty() {
                    push(index, None)?;
                    continue;
                }
                let typed = typed_value(part, value).map_err(|why| BadPart {
                    index,
                    why: Cow::Owned(why),
                })?;
                match typed {
                    Typed::Ip(ip) => push(index, Some(PartValue::Ip(ip)))?,
                    Typed::Text(text) => push(index, Some(PartValue::Bytes(text.as_bytes())))?,
                }
            }
        }
    }
    Ok(tail)
}

/// A typed value as a request would carry it.
enum Typed<'a> {
    Ip(IpAddr),
    Text(Cow<'a, str>),
}

/// Header and const values are keyed as sent; method, host and path as `OriginalRequest`
/// spells them; an address in canonical form. Fails saying why no request carries `value`
/// (not empty: an empty value is an absent part).
fn typed_value<'a>(part: &KeyPart, value: &'a str) -> Result<Typed<'a>, String> {
    let visible = || normalise::visible(value.as_bytes());
    Ok(Typed::Text(match part {
        KeyPart::Ip => {
            // An IPv6 client's network may be written as such: `2001:db8:1:2::/64`.
            return normalise::parse_ip(value.as_bytes())
                .or_else(|| value.parse::<ipnet::IpNet>().ok().map(|net| net.addr()))
                .map(Typed::Ip)
                .ok_or_else(|| format!("{value:?} is not an IP address"));
        }
        KeyPart::Method => visible(),
        KeyPart::Host => normalise::host(visible()),
        KeyPart::Path => normalise::path(visible()),
        // Descriptor values are keyed as Envoy sends them.
        KeyPart::Header(_) | KeyPart::Const(_) | KeyPart::Descriptor(_) => Cow::Borrowed(value),
    }))
}

/// The Redis pub/sub channel on which a reset bucket's key is announced, so every instance's
/// deny cache forgets it.
pub fn resets_channel(prefix: &str) -> String {
    format!("{prefix}:resets")
}

/// [`resets_channel`] of the prefix a bucket key was [`assemble`]d with: the text before
/// `:<limit>:{`, since neither limit names nor prefixes hold braces and names hold no `:`.
pub fn resets_channel_of(key: &str) -> Option<String> {
    let (head, _) = key.split_once(":{")?;
    let (prefix, _limit) = head.rsplit_once(':')?;
    Some(resets_channel(prefix))
}

/// A region's demand hash (one limit across regions): field `"<limit> <hex of a key's
/// tail>"`, the requests counted since the reporter last drained it.
pub fn region_demand_key(prefix: &str) -> String {
    format!("{prefix}:regions:demand")
}

/// The lease of a region's reporter: the id of the instance that streams to the home.
pub fn region_lease_key(prefix: &str) -> String {
    format!("{prefix}:regions:lease")
}

/// The bucket key whose [`tail_in_key`] is `tail` as it reads there (a hashed tail, `#...`,
/// stays as it is: [`assemble`] would hash it again).
pub fn with_tail_text(prefix: &str, limit: &str, tail: &str) -> String {
    format!("{prefix}:{limit}:{{{tail}}}")
}

/// The sorted set where instances announce themselves (`on_error = "local"`).
pub fn instances_key(prefix: &str) -> String {
    format!("{prefix}:instances")
}

/// The hash of every limit's runtime-override version: `<prefix>:{<prefix>:overrides}:versions`.
/// The hash tag puts it and every override hash in one Cluster slot, so one script may change
/// an override and its version together. A bucket key can never take this shape: its tag comes
/// after a non-empty limit name.
pub fn override_versions_key(prefix: &str) -> String {
    format!("{prefix}:{{{prefix}:overrides}}:versions")
}

/// The runtime overrides' store epoch, in the versions' slot: set by the first change (or
/// write-back) to a store that has none, so a store that lost its data (restarted empty)
/// shows another one, or none.
pub fn override_epoch_key(prefix: &str) -> String {
    format!("{prefix}:{{{prefix}:overrides}}:epoch")
}

/// The hash of what was written back after a store lost its data, in the versions' slot:
/// field = limit, value = `<version the writer held> <version the write-back gave it>`.
pub fn override_restored_key(prefix: &str) -> String {
    format!("{prefix}:{{{prefix}:overrides}}:restored")
}

/// The hash of one limit's runtime overrides (field: the key tail), in the versions' slot.
pub fn overrides_key(prefix: &str, limit: &str) -> String {
    override_part_key(prefix, "limit", limit)
}

/// One of the keys that index a limit's runtime overrides, in the versions' slot: `part` is
/// `log` (the version that last changed each key tail), `expiries`, `floor` or `history`.
pub fn override_part_key(prefix: &str, part: &str, limit: &str) -> String {
    format!("{prefix}:{{{prefix}:overrides}}:{part}:{limit}")
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

/// One part's value: bytes to escape, or a client address.
pub enum PartValue<'a> {
    Bytes(&'a [u8]),
    Ip(IpAddr),
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

/// IPv4 as is; IPv6 as its network (`2001:db8:1:2::/64`), or as is with a prefix of 128 (so
/// keys of that setting stay what they always were). Writing to a Vec cannot fail.
fn write_ip(out: &mut Vec<u8>, ip: IpAddr, ipv6_prefix: u8) {
    match ip.to_canonical() {
        IpAddr::V6(v6) if ipv6_prefix < 128 => match Ipv6Net::new(v6, ipv6_prefix) {
            Ok(net) => {
                let _ = write!(out, "{}", net.trunc());
            }
            // Validation keeps the prefix within 128; keying the whole address is the safe side.
            Err(_) => {
                let _ = write!(out, "{v6}");
            }
        },
        ip => {
            let _ = write!(out, "{ip}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor_tail(parts: &[KeyPart], value: &[u8]) -> Result<Vec<u8>, BadPart> {
        build_tail(parts, Source::Descriptor(&|_| Some(value)), false, 128)
    }

    #[test]
    fn descriptor_values_are_escaped_and_hostile_ones_hashed() {
        let parts = [KeyPart::Descriptor("user".into())];
        let key = |value: &[u8]| assemble("tg", "d", &descriptor_tail(&parts, value).unwrap());
        assert_eq!(key(b"a|b"), "tg:d:{a%7Cb}");
        assert_eq!(key(&[b'x'; 100_000]).len(), "tg:d:{#}".len() + 32);
        assert!(key(b"\xff\x00").starts_with("tg:d:{#"));
        assert_eq!(
            descriptor_tail(&parts, b"").map_err(|bad| bad.index),
            Err(0)
        );
        // An override's values find the bucket a descriptor carrying them draws from.
        let given = build_tail(&parts, Source::Typed(&["a|b".to_string()]), false, 128).unwrap();
        assert_eq!(descriptor_tail(&parts, b"a|b"), Ok(given));
    }

    proptest::proptest! {
        /// The four sources agree: the same values, whichever way they come (a request's
        /// header, an operator's typing, a descriptor's entry, an envoyproxy/ratelimit rule's
        /// path), give the same tail, absent ones included.
        #[test]
        fn every_source_spells_the_same_values_alike(
            values in proptest::collection::vec("[ -~]{0,40}", 1..4),
            anonymous: bool,
        ) {
            let values: Vec<String> = values.iter().map(|v| v.trim().to_string()).collect();
            let parts: Vec<KeyPart> =
                (0..values.len()).map(|i| KeyPart::Descriptor(format!("k{i}"))).collect();
            let index = |part: &KeyPart| parts.iter().position(|p| p == part).unwrap_or(0);
            let request = |part: &KeyPart| {
                let value = values[index(part)].as_bytes();
                (!value.is_empty()).then_some(PartValue::Bytes(value))
            };
            let descriptor = |part: &KeyPart| Some(values[index(part)].as_bytes());
            let from_request = build_tail(&parts, Source::Request(&request), anonymous, 128);
            let typed = build_tail(&parts, Source::Typed(&values), anonymous, 128);
            let from_descriptor = build_tail(&parts, Source::Descriptor(&descriptor), anonymous, 128);
            let bytes: Vec<&[u8]> = values.iter().map(|v| v.as_bytes()).collect();
            let entries = build_tail(&parts, Source::Entries(&mut bytes.iter().copied()), anonymous, 128);
            let index_of = |tail: &Result<Vec<u8>, BadPart>| tail.as_ref().map_err(|bad| bad.index).cloned();
            proptest::prop_assert_eq!(index_of(&typed), index_of(&from_request));
            proptest::prop_assert_eq!(index_of(&from_descriptor), index_of(&from_request));
            proptest::prop_assert_eq!(index_of(&entries), index_of(&from_request));
            if let Some(absent) = values.iter().position(String::is_empty) {
                proptest::prop_assert_eq!(from_request.is_err(), !anonymous);
                if !anonymous {
                    proptest::prop_assert_eq!(from_request.map_err(|bad| bad.index), Err(absent));
                }
            }
        }
    }

    fn ip_key(ip: &str, prefix: u8) -> String {
        let mut out = Vec::new();
        write_ip(&mut out, ip.parse().unwrap(), prefix);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn an_ipv6_client_is_keyed_by_its_network() {
        assert_eq!(ip_key("2001:db8:1:2:aaaa::1", 64), "2001:db8:1:2::/64");
        assert_eq!(ip_key("2001:db8:1:2:bbbb::9", 64), "2001:db8:1:2::/64");
        assert_eq!(ip_key("2001:db8:1:3::1", 64), "2001:db8:1:3::/64");
        assert_eq!(ip_key("2001:db8:1:2:aaaa::1", 48), "2001:db8:1::/48");
    }

    #[test]
    fn prefix_128_keys_each_ipv6_address_and_ipv4_is_never_grouped() {
        assert_eq!(ip_key("2001:db8::1", 128), "2001:db8::1");
        assert_eq!(ip_key("2001:db8::2", 128), "2001:db8::2");
        assert_eq!(ip_key("192.0.2.7", 32), "192.0.2.7");
        assert_eq!(ip_key("::ffff:192.0.2.7", 64), "192.0.2.7");
    }

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

    /// A tuple of parts as a request's key would be written (`None`: absent, anonymous).
    fn key_of(parts: &[Option<Vec<u8>>]) -> String {
        let mut values = parts.iter().map(|part| part.as_deref().unwrap_or_default());
        let tail = build_tail(&[], Source::Entries(&mut values), true, 64).unwrap();
        assemble("tg", "limit", &tail)
    }

    fn part() -> impl proptest::strategy::Strategy<Value = Option<Vec<u8>>> {
        use proptest::prelude::*;
        // Few distinct bytes, rich in separators and escapes, so near-collisions are common;
        // up to 200 bytes, so some tails are hashed and some are not.
        let byte = prop_oneof![
            Just(b'%'),
            Just(b'|'),
            Just(b'#'),
            Just(b'{'),
            Just(b'}'),
            Just(b'a'),
            Just(b'2'),
            Just(b'5'),
            Just(b'7'),
            Just(b'C'),
            Just(0xff),
        ];
        proptest::option::weighted(0.9, proptest::collection::vec(byte, 0..200))
    }

    /// Values of a limit's key parts; `None` is an absent part.
    type Tuple = Vec<Option<Vec<u8>>>;

    /// Short values over a tiny alphabet of separators and escape digits: among 64 such
    /// tuples, values that a broken escaping would confuse (`a|b`,`c` and `a`,`b|c`; `%7C` and
    /// `|`) come up in most runs.
    fn many_short_tuples() -> impl proptest::strategy::Strategy<Value = Vec<Tuple>> {
        use proptest::prelude::*;
        let byte = proptest::sample::select(vec![b'%', b'|', b'7', b'C', b'a', b'{', b'}']);
        let part = proptest::option::weighted(0.9, proptest::collection::vec(byte, 0..4));
        (1usize..4).prop_flat_map(move |n| {
            proptest::collection::vec(proptest::collection::vec(part.clone(), n), 64)
        })
    }

    proptest::proptest! {
        #[test]
        fn no_two_distinct_tuples_share_a_key(tuples in many_short_tuples()) {
            let mut seen = std::collections::HashMap::new();
            for tuple in tuples {
                // Absent and empty are one value (both mean "missing").
                let tuple: Tuple = tuple.into_iter().map(|p| p.filter(|v| !v.is_empty())).collect();
                if let Some(earlier) = seen.insert(key_of(&tuple), tuple.clone()) {
                    proptest::prop_assert_eq!(earlier, tuple);
                }
            }
        }

        #[test]
        // Long values too, so hashed tails are compared with hashed and plain ones.
        fn a_tuple_differing_in_one_part_gets_another_key(
            base in proptest::collection::vec(part(), 1..4),
            index in 0usize..4,
            other in part(),
        ) {
            let mut changed: Tuple = base.clone();
            let i = index % base.len();
            changed[i] = other;
            let same = base[i].as_deref().unwrap_or_default() == changed[i].as_deref().unwrap_or_default();
            proptest::prop_assert_eq!(same, key_of(&base) == key_of(&changed));
        }
    }

    #[test]
    fn the_reset_channel_is_found_from_any_key_of_its_prefix() {
        for prefix in ["tg", "a:b", "x-1:"] {
            let key = assemble(prefix, "per-ip", b"a:{b}|c");
            assert_eq!(resets_channel_of(&key), Some(resets_channel(prefix)));
        }
        assert_eq!(resets_channel_of("plain"), None);
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
            "descriptor:remote_address",
        ] {
            assert_eq!(KeyPart::parse(text).unwrap().to_string(), text);
        }
        assert!(KeyPart::parse("header:bad header").is_err());
        assert!(KeyPart::parse("cookie").is_err());
        assert!(KeyPart::parse("descriptor:").is_err());
    }
}
