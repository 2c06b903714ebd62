//! Per-key policies of a limit: `[[limits.overrides]]` and the entries of its
//! `overrides_file`. An override gives one key value its own rate and burst, or exempts it
//! from the limit. The key keeps its bucket (the same store key): only the numbers change.
//!
//! Lookups are one hash probe by the escaped key tail the bucket key is built from
//! ([`crate::base::keys::build_tail`]), so 100,000 overrides cost a check what one does.

use std::collections::HashMap;
use std::path::Path;

use crate::base::keys::{self, KeyPart, Source};
use crate::config::{check_burst, check_refill, ConfigError, OverrideConfig, OverridesFile};

/// What one key gets instead of the limit's own policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Override {
    /// Not limited by this limit: no bucket, no store call.
    Unlimited,
    Bucket {
        rate: f64,
        burst: u64,
    },
}

/// The limit's own numbers, that an override's omitted fields keep, and how its `ip` key part
/// is keyed.
#[derive(Debug, Clone, Copy)]
pub struct Base {
    pub rate: f64,
    pub burst: u64,
    pub cost: u64,
    /// How far below 0 a report may drive a key (`max_debt` of a `charge = "report"` limit,
    /// else 0): an override's bucket must refill it too within what the store can express.
    pub debt: u64,
    pub ipv6_prefix: u8,
    /// The limit is a quota: `burst` is its quota and an override may only set `quota`.
    pub quota: bool,
}

/// Every override of one limit, by key tail.
#[derive(Debug, Default)]
pub struct Overrides {
    by_tail: HashMap<Box<[u8]>, Override>,
}

impl Overrides {
    /// Builds the inline overrides, then the file's: the first entry for a key wins. `at` is
    /// the limit's dotted key (`limits.<name>`), for errors.
    pub fn compile(
        inline: &[OverrideConfig],
        file: Option<&Path>,
        parts: &[KeyPart],
        base: Base,
        at: &str,
    ) -> Result<Overrides, ConfigError> {
        let mut overrides = Overrides::default();
        for (i, entry) in inline.iter().enumerate() {
            overrides
                .add(entry, parts, base)
                .map_err(|e| e.within(&format!("{at}.overrides[{i}]")))?;
        }
        if let Some(path) = file {
            let key = format!("{at}.overrides_file");
            for_each_entry(path, &key, |i, entry| {
                overrides
                    .add(entry, parts, base)
                    .map_err(|e| e.within(&format!("{key} ({}) overrides[{i}]", path.display())))
            })?;
        }
        Ok(overrides)
    }

    /// Adds one entry; an error's key is relative to the entry.
    fn add(
        &mut self,
        entry: &OverrideConfig,
        parts: &[KeyPart],
        base: Base,
    ) -> Result<(), ConfigError> {
        if entry.key.len() != parts.len() {
            return Err(ConfigError::new(
                "key",
                format!(
                    "has {} value(s); the limit's key has {} part(s) [{}]",
                    entry.key.len(),
                    parts.len(),
                    parts
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let tail = keys::build_tail(parts, Source::Typed(&entry.key), false, base.ipv6_prefix)
            .map_err(|bad| ConfigError::new(format!("key[{}]", bad.index), bad.why))?;
        let policy = parse(entry, base)?;
        self.by_tail
            .entry(tail.into_boxed_slice())
            .or_insert(policy);
        Ok(())
    }

    /// The override for a request whose key tail is `tail`.
    pub fn get(&self, tail: &[u8]) -> Option<Override> {
        if self.by_tail.is_empty() {
            return None;
        }
        self.by_tail.get(tail).copied()
    }

    /// Distinct keys overridden.
    pub fn len(&self) -> usize {
        self.by_tail.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_tail.is_empty()
    }
}

/// One entry's policy: `unlimited` alone, or a rate and/or a burst. Error keys are relative.
pub fn parse(entry: &OverrideConfig, base: Base) -> Result<Override, ConfigError> {
    if entry.unlimited {
        let extra = if entry.rate.is_some() {
            "rate"
        } else {
            "burst"
        };
        if entry.rate.is_some() || entry.burst.is_some() || entry.quota.is_some() {
            let extra = if entry.quota.is_some() {
                "quota"
            } else {
                extra
            };
            return Err(ConfigError::new(
                "unlimited",
                format!("cannot be combined with {extra}: an unlimited key has no bucket"),
            ));
        }
        return Ok(Override::Unlimited);
    }
    if base.quota {
        return parse_quota(entry, base);
    }
    if entry.quota.is_some() {
        return Err(ConfigError::new(
            "quota",
            "applies to quota limits only (a bucket's override sets rate and burst)",
        ));
    }
    if entry.rate.is_none() && entry.burst.is_none() {
        return Err(ConfigError::new(
            "",
            "needs rate, burst, or unlimited = true",
        ));
    }
    let rate = match &entry.rate {
        Some(spec) => spec
            .per_second()
            .map_err(|why| ConfigError::new("rate", why))?,
        None => base.rate,
    };
    let burst = entry.burst.unwrap_or(base.burst);
    check_burst(burst, base.cost, "burst")?;
    check_refill(
        rate,
        burst,
        base.debt,
        if entry.rate.is_some() {
            "rate"
        } else {
            "burst"
        },
    )?;
    Ok(Override::Bucket { rate, burst })
}

/// A quota limit's override: `quota` alone (the period is the limit's). Error keys are
/// relative.
fn parse_quota(entry: &OverrideConfig, base: Base) -> Result<Override, ConfigError> {
    if entry.rate.is_some() || entry.burst.is_some() {
        let key = if entry.rate.is_some() {
            "rate"
        } else {
            "burst"
        };
        return Err(ConfigError::new(
            key,
            "the limit is a quota: its override sets quota (or unlimited = true)",
        ));
    }
    let Some(quota) = entry.quota else {
        return Err(ConfigError::new("", "needs quota, or unlimited = true"));
    };
    check_burst(quota, base.cost, "quota")?;
    Ok(Override::Bucket {
        rate: base.rate,
        burst: quota,
    })
}

/// Entries parsed at once. The TOML parser holds about 2.5 KB per entry while it works, so a
/// file of 100,000 entries parsed whole would briefly take 250 MB.
const BATCH: usize = 1000;

/// Reads an `overrides_file` batch by batch, calling `each(index, entry)` in file order. Every
/// error is one line naming the file's key (and the line, for syntax errors).
fn for_each_entry(
    path: &Path,
    key: &str,
    mut each: impl FnMut(usize, &OverrideConfig) -> Result<(), ConfigError>,
) -> Result<(), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        ConfigError::new(key, format!("cannot read {}: {error}", path.display()))
    })?;
    let mut index = 0;
    for (first_line, chunk) in batches(&text, BATCH) {
        let file: OverridesFile = toml::from_str(chunk).map_err(|error| {
            let line = error
                .span()
                .and_then(|span| chunk.get(..span.start))
                .map(|before| first_line + before.matches('\n').count());
            let message = error.message().split_whitespace().collect::<Vec<_>>();
            ConfigError::new(
                key,
                format!(
                    "{}{}: {}",
                    path.display(),
                    line.map_or(String::new(), |l| format!(" line {l}")),
                    message.join(" ")
                ),
            )
        })?;
        for entry in &file.overrides {
            each(index, entry)?;
            index += 1;
        }
    }
    Ok(())
}

/// Splits a file before every `size`-th line that opens an `[[overrides]]` table; each piece
/// is a TOML document of its own. Yields (line number of the piece's first line, piece). A
/// header spelled otherwise (`[[ overrides ]]`) only makes a piece longer; a split inside a
/// multi-line string (a key holding a line `[[overrides]]`) is a parse error, never a wrong
/// entry.
fn batches(text: &str, size: usize) -> Vec<(usize, &str)> {
    let mut pieces = Vec::new();
    let (mut start, mut start_line, mut headers, mut offset) = (0, 1, 0, 0);
    for (line_index, line) in text.split_inclusive('\n').enumerate() {
        if line.trim_start().starts_with("[[overrides]]") {
            if headers == size {
                pieces.push((start_line, &text[start..offset]));
                (start, start_line, headers) = (offset, line_index + 1, 0);
            }
            headers += 1;
        }
        offset += line.len();
    }
    pieces.push((start_line, &text[start..]));
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::rate::RateSpec;

    const BASE: Base = Base {
        rate: 10.0,
        burst: 20,
        cost: 1,
        debt: 0,
        ipv6_prefix: 64,
        quota: false,
    };

    fn entry(key: &[&str]) -> OverrideConfig {
        OverrideConfig {
            key: key.iter().map(|k| k.to_string()).collect(),
            rate: None,
            burst: None,
            quota: None,
            unlimited: false,
        }
    }

    fn compile(entries: &[OverrideConfig], parts: &[KeyPart]) -> Result<Overrides, ConfigError> {
        Overrides::compile(entries, None, parts, BASE, "limits.l")
    }

    #[test]
    fn omitted_numbers_are_the_limits_own() {
        let mut only_burst = entry(&["acme"]);
        only_burst.burst = Some(500);
        let mut only_rate = entry(&["beta"]);
        only_rate.rate = Some(RateSpec::Text("600/min".into()));
        let header = [KeyPart::Header("x-api-key".into())];
        let overrides = compile(&[only_burst, only_rate], &header).unwrap();
        assert_eq!(
            overrides.get(b"acme"),
            Some(Override::Bucket {
                rate: 10.0,
                burst: 500
            })
        );
        assert_eq!(
            overrides.get(b"beta"),
            Some(Override::Bucket {
                rate: 10.0,
                burst: 20
            })
        );
        assert_eq!(overrides.get(b"gamma"), None);
    }

    #[test]
    fn a_quota_limit_takes_only_quota_overrides_and_a_bucket_none() {
        let quota_base = Base {
            rate: 0.0,
            burst: 1000,
            quota: true,
            ..BASE
        };
        let header = [KeyPart::Header("x-api-key".into())];
        let compile_quota = |entries: &[OverrideConfig]| {
            Overrides::compile(entries, None, &header, quota_base, "limits.l")
        };
        let mut bigger = entry(&["acme"]);
        bigger.quota = Some(50_000);
        let overrides = compile_quota(&[bigger.clone()]).unwrap();
        assert_eq!(
            overrides.get(b"acme"),
            Some(Override::Bucket {
                rate: 0.0,
                burst: 50_000
            })
        );
        let mut burst = entry(&["acme"]);
        burst.burst = Some(5);
        let error = compile_quota(&[burst]).unwrap_err();
        assert_eq!(error.key, "limits.l.overrides[0].burst");
        let error = compile_quota(&[entry(&["acme"])]).unwrap_err();
        assert_eq!(error.key, "limits.l.overrides[0]");
        let mut zero = entry(&["acme"]);
        zero.quota = Some(0);
        assert_eq!(
            compile_quota(&[zero]).unwrap_err().key,
            "limits.l.overrides[0].quota"
        );
        let error = compile(&[bigger], &header).unwrap_err();
        assert_eq!(error.key, "limits.l.overrides[0].quota");
    }

    #[test]
    fn an_override_of_a_reported_limit_must_refill_its_debt_within_ten_years() {
        let reported = Base {
            debt: 1_000_000_000,
            ..BASE
        };
        let header = [KeyPart::Header("k".into())];
        let mut slow = entry(&["a"]);
        slow.rate = Some(RateSpec::PerSecond(1e-7));
        slow.burst = Some(1);
        let error =
            Overrides::compile(&[slow.clone()], None, &header, reported, "limits.l").unwrap_err();
        assert_eq!(error.key, "limits.l.overrides[0].rate");
        assert!(error.reason.contains("max_debt of 1000000000"), "{error}");
        assert!(
            compile(&[slow], &header).is_ok(),
            "no debt: 1e7 s to refill"
        );
    }

    #[test]
    fn the_first_entry_for_a_key_wins() {
        let mut first = entry(&["acme"]);
        first.unlimited = true;
        let mut second = entry(&["acme"]);
        second.burst = Some(1);
        let overrides = compile(&[first, second], &[KeyPart::Header("k".into())]).unwrap();
        assert_eq!(overrides.get(b"acme"), Some(Override::Unlimited));
        assert_eq!(overrides.len(), 1);
    }

    #[test]
    fn values_are_matched_as_requests_are_keyed() {
        let mut by_ip_and_host = entry(&["2001:DB8:0::1", "API.Example.com.:8443"]);
        by_ip_and_host.burst = Some(5);
        let mut by_network = entry(&["2001:db8:0:7::/64", "x"]);
        by_network.burst = Some(6);
        let mut v4 = entry(&["::ffff:192.0.2.1", "x"]);
        v4.burst = Some(7);
        let parts = [KeyPart::Ip, KeyPart::Host];
        let overrides = compile(&[by_ip_and_host, by_network, v4], &parts).unwrap();
        assert!(overrides.get(b"2001:db8::/64|api.example.com").is_some());
        assert!(overrides.get(b"2001:db8:0:7::/64|x").is_some());
        assert!(overrides.get(b"192.0.2.1|x").is_some());
        let mut path = entry(&["/api/./v1//items"]);
        path.burst = Some(5);
        let overrides = compile(&[path], &[KeyPart::Path]).unwrap();
        assert!(overrides.get(b"/api/v1/items").is_some());
        let mut separator = entry(&["a|b"]);
        separator.burst = Some(5);
        let overrides = compile(&[separator], &[KeyPart::Header("k".into())]).unwrap();
        assert!(
            overrides.get(b"a%7Cb").is_some(),
            "escaped like a request value"
        );
    }

    #[test]
    fn a_file_is_parsed_in_batches_with_every_entry_in_order_and_lines_counted_from_the_top() {
        let text: String = (0..25)
            .map(|i| format!("[[overrides]]\nkey = [\"k{i}\"]\nburst = {}\n", i + 1))
            .collect();
        let pieces = batches(&text, 10);
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces.iter().map(|(_, p)| *p).collect::<String>(), text);
        assert_eq!(pieces[1].0, 31, "10 entries of 3 lines before it");

        let dir = std::env::temp_dir().join(format!("overrides-batches-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keys.toml");
        std::fs::write(&path, &text).unwrap();
        let mut seen = Vec::new();
        for_each_entry(&path, "k", |i, entry| {
            seen.push((i, entry.key[0].clone()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen.len(), 25);
        assert!(seen
            .iter()
            .enumerate()
            .all(|(i, (j, key))| i == *j && *key == format!("k{i}")));

        let broken = text.clone() + "[[overrides]]\nkey = [\"x\"]\nbrust = 3\n";
        std::fs::write(&path, broken).unwrap();
        let error = for_each_entry(&path, "k", |_, _| Ok(())).unwrap_err();
        assert!(
            error.reason.contains("line 78: unknown field `brust`"),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn wrong_shapes_are_refused_naming_the_entry() {
        let header = [KeyPart::Header("k".into())];
        let mut two_values = entry(&["a", "b"]);
        two_values.burst = Some(5);
        let error = compile(&[two_values], &header).unwrap_err();
        assert_eq!(error.key, "limits.l.overrides[0].key");
        assert!(error.reason.contains("has 2 value(s)"), "{error}");

        let mut both = entry(&["a"]);
        both.unlimited = true;
        both.rate = Some(RateSpec::PerSecond(5.0));
        let error = compile(&[both], &header).unwrap_err();
        assert_eq!(error.key, "limits.l.overrides[0].unlimited");
        assert!(error.reason.contains("rate"), "{error}");

        let error = compile(&[entry(&["a"])], &header).unwrap_err();
        assert_eq!(error.key, "limits.l.overrides[0]");

        let mut bad_ip = entry(&["not-an-ip"]);
        bad_ip.burst = Some(5);
        let error = compile(&[bad_ip], &[KeyPart::Ip]).unwrap_err();
        assert_eq!(error.key, "limits.l.overrides[0].key[0]");

        let mut eleven_years = entry(&["a"]);
        eleven_years.rate = Some(RateSpec::Text("20/day".into()));
        eleven_years.burst = Some(80_000);
        let error = compile(&[eleven_years], &header).unwrap_err();
        assert_eq!(error.key, "limits.l.overrides[0].rate");
        assert!(error.reason.contains("at most ten years"), "{error}");

        let mut below_cost = entry(&["a"]);
        below_cost.burst = Some(0);
        let error = compile(&[below_cost], &header).unwrap_err();
        assert_eq!(error.key, "limits.l.overrides[0].burst");

        let mut bad_unit = entry(&["a"]);
        bad_unit.rate = Some(RateSpec::Text("5/fortnight".into()));
        let error = compile(&[bad_unit], &header).unwrap_err();
        assert_eq!(error.key, "limits.l.overrides[0].rate");
    }
}
