//! One access log line: read up to a cap into a reused buffer, and its fields parsed in place
//! from nginx's combined format or a JSON object.

use std::borrow::Cow;
use std::io::BufRead;

use serde::de::{self, Deserializer as _, IgnoredAny, MapAccess, Visitor};

/// One line's fields, borrowed from the line buffer where possible.
#[derive(Default)]
pub struct Fields<'l> {
    pub ip: Option<Cow<'l, str>>,
    pub time: Option<Cow<'l, str>>,
    pub method: Option<Cow<'l, str>>,
    pub path: Option<Cow<'l, str>>,
    pub host: Option<Cow<'l, str>>,
    pub headers: Vec<Option<Cow<'l, str>>>,
}

pub struct JsonFields {
    pub ip: String,
    pub time: String,
    pub method: String,
    pub path: String,
    pub host: String,
    pub headers: Vec<String>,
}

/// The longest log line read; nginx's own lines are far shorter (its request line buffer is a
/// few KiB).
pub const MAX_LINE: usize = 64 * 1024;

pub enum Line {
    Read,
    TooLong,
    End,
}

/// One line (with its newline) into `line`, at most [`MAX_LINE`] bytes of it kept.
pub fn read_line(reader: &mut impl BufRead, line: &mut Vec<u8>) -> std::io::Result<Line> {
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

/// `$remote_addr - $remote_user [$time_local] "$request" ...`: the address, the time and the
/// request line's method and URI (the rest is not needed).
pub fn combined(line: &[u8]) -> Option<Fields<'_>> {
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
pub fn json<'l>(line: &'l [u8], names: &JsonFields) -> Option<Fields<'l>> {
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
