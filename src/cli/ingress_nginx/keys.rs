//! nginx variable expressions (`global-rate-limit-key`) spelled as tollgate key parts.

/// The tollgate key of an nginx variable expression (`global-rate-limit-key`).
#[derive(Debug, PartialEq)]
pub(super) struct KeyPlan {
    pub(super) parts: Vec<String>,
    /// Header parts only: nginx interpolates absent headers as "", and ingress-nginx keys an
    /// empty result by `$remote_addr`.
    pub(super) headers_only: bool,
}

/// Parses `$var`, `${var}` and literal text. Literals next to variables only separate them
/// and do not change which requests share a bucket, so they are dropped; a key of literals
/// only is one shared bucket. `Err`: malformed text or a variable tollgate cannot key on.
pub(super) fn nginx_key(text: &str) -> Result<KeyPlan, KeyError> {
    let mut parts: Vec<String> = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        literal.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, next) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced
                .find('}')
                .ok_or_else(|| KeyError::Malformed(format!("unclosed ${{ in {text:?}")))?;
            (&braced[..end], &braced[end + 1..])
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(KeyError::Malformed(format!(
                "a $ without a variable name in {text:?}"
            )));
        }
        let part = variable_part(name).ok_or_else(|| KeyError::Unsupported(name.to_string()))?;
        if !parts.contains(&part) {
            parts.push(part);
        }
        rest = next;
    }
    literal.push_str(rest);
    if parts.is_empty() {
        if literal.is_empty() {
            return Err(KeyError::Malformed("is empty".into()));
        }
        parts.push(format!("const:{literal}"));
    }
    let headers_only = parts.iter().all(|p| p.starts_with("header:"));
    Ok(KeyPlan {
        parts,
        headers_only,
    })
}

#[derive(Debug, PartialEq)]
pub(super) enum KeyError {
    Malformed(String),
    /// A variable with no tollgate key part.
    Unsupported(String),
}

/// The key part an nginx variable becomes, if tollgate has one.
fn variable_part(name: &str) -> Option<String> {
    match name {
        "remote_addr" | "binary_remote_addr" | "realip_remote_addr" => Some("ip".into()),
        "host" | "http_host" | "server_name" => Some("host".into()),
        "uri" | "document_uri" | "request_uri" => Some("path".into()),
        "request_method" => Some("method".into()),
        _ => name
            .strip_prefix("http_")
            .filter(|h| !h.is_empty())
            .map(|h| format!("header:{}", h.replace('_', "-"))),
    }
}
