//! Redaction: how a key value (an API key, a user id, an exempt rule's header value) is shown
//! to someone who may read but does not hold the admin token: as a fingerprint, the first 12
//! hex digits of a SHA-256 salted per deployment. Only a bare IP address or network
//! (`203.0.113.9`, `2001:db8::/64`) is shown as it is: what an operator needs to recognise a
//! client, and nothing a client could use.
//!
//! The salt makes a fingerprint useless outside its deployment: without it, a low-entropy key
//! (a user id, a short API key) is found again by hashing a dictionary. It comes from the
//! configured `fingerprint_salt`; else from the admin token (fingerprints then change when the
//! token is rotated); else it is drawn at random once per process (each instance, and each
//! restart, then shows other fingerprints for one key).
//!
//! Used by the admin API (peek, overrides, top, limits) and the denial log alike.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::OnceLock;

use ipnet::IpNet;
use sha2::{Digest, Sha256};

/// Who sent an admin request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// Sent `Authorization: Bearer <admin_token>` matching the configured token.
    Operator,
    /// Anyone else: may read, sees key values as fingerprints, may not change anything.
    Anonymous,
}

/// The per-deployment secret fingerprints are salted with.
#[derive(Clone, PartialEq, Eq)]
pub struct Salt([u8; 32]);

impl std::fmt::Debug for Salt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Salt(***)")
    }
}

impl Salt {
    /// From a configured secret (`fingerprint_salt`): every instance given it agrees.
    pub fn configured(secret: &str) -> Salt {
        Salt::derived(b"tollgate fingerprint salt", secret.as_bytes())
    }

    /// From the admin token, when no salt is configured: every instance sharing the token
    /// agrees, and the token itself cannot be recovered from a fingerprint.
    pub fn from_admin_token(token: &str) -> Salt {
        Salt::derived(
            b"tollgate fingerprint salt from the admin token",
            token.as_bytes(),
        )
    }

    /// Drawn at random once per process, when neither a salt nor a token is configured.
    pub fn per_process() -> Salt {
        static DRAWN: OnceLock<Salt> = OnceLock::new();
        DRAWN
            .get_or_init(|| {
                let mut bytes = [0u8; 32];
                if getrandom::getrandom(&mut bytes).is_err() {
                    // No OS randomness: the std hasher's keys (randomised per process where
                    // the platform allows), the time and the process id.
                    bytes = fallback_entropy();
                }
                Salt(bytes)
            })
            .clone()
    }

    fn derived(label: &[u8], secret: &[u8]) -> Salt {
        let mut hasher = Sha256::new();
        hasher.update(label);
        hasher.update([0]);
        hasher.update(secret);
        Salt(hasher.finalize().into())
    }

    /// First 12 hex digits of SHA-256(salt, value).
    pub fn fingerprint(&self, value: &str) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.0);
        hasher.update(value.as_bytes());
        let digest = hasher.finalize();
        let mut out = String::with_capacity(12);
        for byte in &digest[..6] {
            let _ = write!(out, "{byte:02x}");
        }
        out
    }

    /// A key value as `caller` may see it: as it is to the token holder, and a bare IP
    /// address or network to anyone; anything else (API keys, user ids, `<ip>/<anything>`)
    /// as its fingerprint.
    pub fn shown<'v>(&self, value: &'v str, caller: Caller) -> Cow<'v, str> {
        if caller == Caller::Operator || is_address(value) {
            return Cow::Borrowed(value);
        }
        Cow::Owned(self.fingerprint(value))
    }

    /// A value that may grant something (an exempt rule's header value) as `caller` may see
    /// it: as it is to the token holder only, whatever it looks like. An empty value ("the
    /// header is absent") hides nothing.
    pub fn secret<'v>(&self, value: &'v str, caller: Caller) -> Cow<'v, str> {
        if caller == Caller::Operator || value.is_empty() {
            return Cow::Borrowed(value);
        }
        Cow::Owned(self.fingerprint(value))
    }
}

/// A bare IP address (`203.0.113.9`, `2001:db8::1`) or network (`2001:db8::/64`), spelled
/// exactly so: nothing else may ride along.
pub fn is_address(value: &str) -> bool {
    value.parse::<IpAddr>().is_ok() || value.parse::<IpNet>().is_ok()
}

fn fallback_entropy() -> [u8; 32] {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = Sha256::new();
    for i in 0..4u64 {
        let mut std_hasher = std::collections::hash_map::RandomState::new().build_hasher();
        std_hasher.write_u64(i);
        hasher.update(std_hasher.finish().to_le_bytes());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    hasher.update(now.to_le_bytes());
    hasher.update(std::process::id().to_le_bytes());
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_addresses_are_shown_anything_else_fingerprinted() {
        let salt = Salt::configured("s");
        assert_eq!(salt.shown("203.0.113.9", Caller::Anonymous), "203.0.113.9");
        assert_eq!(
            salt.shown("2001:db8::/64", Caller::Anonymous),
            "2001:db8::/64"
        );
        assert_eq!(salt.shown("10.0.0.0/8", Caller::Anonymous), "10.0.0.0/8");
        for hidden in [
            "sk_live_secret",
            "10.0.0.1/sk_live_secret",
            "2001:db8::/64/x",
            "10.0.0.1/",
            "10.0.0.1 ",
        ] {
            let shown = salt.shown(hidden, Caller::Anonymous);
            assert_eq!(shown, salt.fingerprint(hidden), "{hidden:?}");
            assert_eq!(shown.len(), 12);
        }
        assert_eq!(
            salt.shown("sk_live_secret", Caller::Operator),
            "sk_live_secret"
        );
    }

    #[test]
    fn fingerprints_depend_on_the_salt_and_are_not_the_bare_hash() {
        let value = "user-42";
        let a = Salt::configured("deployment-a");
        let b = Salt::configured("deployment-b");
        assert_ne!(a.fingerprint(value), b.fingerprint(value));
        assert_eq!(
            a.fingerprint(value),
            Salt::configured("deployment-a").fingerprint(value)
        );
        // sha256("abc") = ba7816bf8f01...: an unsalted fingerprint is a dictionary away.
        assert_ne!(a.fingerprint("abc"), "ba7816bf8f01");
        assert_ne!(
            Salt::from_admin_token("deployment-a").fingerprint(value),
            a.fingerprint(value),
            "a token and a salt of the same text are different salts"
        );
        assert_eq!(Salt::per_process(), Salt::per_process());
    }

    #[test]
    fn secret_values_are_hidden_even_when_they_look_like_addresses() {
        let salt = Salt::configured("s");
        assert_eq!(salt.secret("10.0.0.1", Caller::Anonymous).len(), 12);
        assert_eq!(salt.secret("", Caller::Anonymous), "");
        assert_eq!(salt.secret("bypass", Caller::Operator), "bypass");
    }
}
