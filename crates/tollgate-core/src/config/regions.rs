//! `[region]` and `[home]`: one limit across regions. A limit with `scope = "global"` is
//! decided in each region against the region's floor (a fixed fraction of the limit) and the
//! share the home last assigned it; the home partitions the rest among the regions as its
//! quota service partitions a limit among Envoys (`docs/regions.md`). The tables are checked
//! here, against the limits that name a scope.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::tls_files::{TlsFiles, TlsKeys};
use super::{ConfigError, LimitConfig};

/// Where a limit is decided.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// This store's limit, as every limit was before regions.
    #[default]
    Local,
    /// One limit across every region: each decides against its floor and its share.
    Global,
}

impl Scope {
    pub fn is_local(&self) -> bool {
        *self == Scope::Local
    }
}

/// `[region]`: this instance serves one region of global limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionConfig {
    /// The region's name, as the home's `regions` table names it.
    pub name: String,
    /// `host:port` of the home's gRPC listener.
    pub home: String,
    /// This region's fraction of every global limit, never moved: 0 < floor <= 1.
    pub floor: f64,
    /// How often the region's reporter sends its demand to the home.
    #[serde(default = "default_report_every_ms")]
    pub report_every_ms: u64,
    /// TLS to the home (absent: plain HTTP/2): the CA to trust (else the system's roots) and
    /// a certificate with its key to show (the home's `grpc_tls.client_ca_file` asks for one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsFiles>,
}

/// What names each file of `[region.tls]` in a refusal.
pub const TLS_KEYS: TlsKeys = TlsKeys {
    ca: "region.tls.ca_file",
    cert: "region.tls.cert_file",
    key: "region.tls.key_file",
};

fn default_report_every_ms() -> u64 {
    1000
}

/// `[home]`: this instance keeps the shares of the regions' global limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HomeConfig {
    /// Each region's floor, as the regions themselves say it (sum <= 1).
    pub regions: BTreeMap<String, f64>,
}

/// The most regions a home serves: each is one holder of every global pool.
pub const MAX_REGIONS: usize = 64;

/// The bounds of `region.report_every_ms`.
pub const REPORT_EVERY_MS: std::ops::RangeInclusive<u64> = 50..=60_000;

/// A floor in millionths, as the scripts take it: rounded down, so a floor never grows.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "checked to be in (0, 1] first: the product is in 0..=10^6"
)]
pub fn floor_ppm(floor: f64) -> u32 {
    (floor * 1_000_000.0).floor() as u32
}

/// `[a-z0-9-]+`, at most 64 characters: a region name goes into holder ids and labels.
fn valid_region_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn check_floor(floor: f64, key: &str) -> Result<(), ConfigError> {
    if !(floor > 0.0 && floor <= 1.0) || floor_ppm(floor) == 0 {
        return Err(ConfigError::new(
            key,
            "must be above 0 and at most 1 (a fraction of each global limit, at least 0.000001)",
        ));
    }
    Ok(())
}

/// The regions' settings against the limits: every refusal names its key.
pub fn check(
    region: Option<&RegionConfig>,
    home: Option<&HomeConfig>,
    limits: &[LimitConfig],
    grpc_listen: bool,
) -> Result<(), ConfigError> {
    if region.is_some() && home.is_some() {
        // A home that also served a region would be a holder of its own pools: its checks
        // would need a reporter to itself. Two processes keep the roles apart.
        return Err(ConfigError::new(
            "home",
            "an instance is a region or the home, not both (remove [region] or [home])",
        ));
    }
    if let Some(region) = region {
        if !valid_region_name(&region.name) {
            return Err(ConfigError::new(
                "region.name",
                format!(
                    "{:?} must match [a-z0-9-]+ (at most 64 characters)",
                    region.name
                ),
            ));
        }
        check_floor(region.floor, "region.floor")?;
        if region.home.is_empty() || !region.home.contains(':') {
            return Err(ConfigError::new(
                "region.home",
                "must be host:port of the home's gRPC listener",
            ));
        }
        if let Some(tls) = &region.tls {
            tls.identity(TLS_KEYS)?;
            tls.check_readable(TLS_KEYS)?;
        }
        if !REPORT_EVERY_MS.contains(&region.report_every_ms) {
            return Err(ConfigError::new(
                "region.report_every_ms",
                format!(
                    "must be between {} and {}",
                    REPORT_EVERY_MS.start(),
                    REPORT_EVERY_MS.end()
                ),
            ));
        }
    }
    if let Some(home) = home {
        if !grpc_listen {
            return Err(ConfigError::new(
                "home",
                "the regions reach the home on grpc_listen: set it",
            ));
        }
        if home.regions.is_empty() || home.regions.len() > MAX_REGIONS {
            return Err(ConfigError::new(
                "home.regions",
                format!("must name between 1 and {MAX_REGIONS} regions"),
            ));
        }
        let mut sum = 0u64;
        for (name, floor) in &home.regions {
            if !valid_region_name(name) {
                return Err(ConfigError::new(
                    format!("home.regions.{name}"),
                    "a region name must match [a-z0-9-]+ (at most 64 characters)",
                ));
            }
            check_floor(*floor, &format!("home.regions.{name}"))?;
            sum += u64::from(floor_ppm(*floor));
        }
        if sum > 1_000_000 {
            return Err(ConfigError::new(
                "home.regions",
                "the floors sum to more than 1: the regions could admit more than the limit",
            ));
        }
    }
    for limit in limits.iter().filter(|limit| !limit.scope.is_local()) {
        let at = format!("limits.{}.scope", limit.name);
        if region.is_none() && home.is_none() {
            return Err(ConfigError::new(
                at,
                "a global limit needs [region] (in a region) or [home] (at home)",
            ));
        }
        let kind = if limit.quota.is_some() || limit.period.is_some() {
            Some("a quota")
        } else if limit.concurrency.is_some() {
            Some("a concurrency limit")
        } else if limit.reserve.is_some() || limit.reserve_header.is_some() {
            Some("a reserving limit")
        } else if limit.charge != super::Charge::Request {
            Some("a limit charged by reports")
        } else {
            None
        };
        if let Some(kind) = kind {
            return Err(ConfigError::new(
                at,
                format!("\"global\" applies only to a plain token bucket, not to {kind}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(floor: f64) -> RegionConfig {
        RegionConfig {
            name: "eu-west".into(),
            home: "home.example:8081".into(),
            floor,
            report_every_ms: 1000,
            tls: None,
        }
    }

    #[test]
    fn floors_are_fractions_and_sum_to_at_most_one() {
        assert!(check(Some(&region(0.34)), None, &[], false).is_ok());
        for floor in [0.0, -0.1, 1.01, f64::NAN, 0.000_000_1] {
            let refused = check(Some(&region(floor)), None, &[], false).unwrap_err();
            assert_eq!(refused.key, "region.floor", "{floor}");
        }
        let home = HomeConfig {
            regions: [("a".to_string(), 0.5), ("b".to_string(), 0.6)].into(),
        };
        assert_eq!(
            check(None, Some(&home), &[], true).unwrap_err().key,
            "home.regions"
        );
        let home = HomeConfig {
            regions: [("a".to_string(), 0.5), ("b".to_string(), 0.5)].into(),
        };
        assert!(check(None, Some(&home), &[], true).is_ok());
        assert_eq!(
            check(None, Some(&home), &[], false).unwrap_err().key,
            "home"
        );
    }

    #[test]
    fn floor_ppm_rounds_down() {
        assert_eq!(floor_ppm(0.34), 340_000);
        assert_eq!(floor_ppm(1.0), 1_000_000);
        assert_eq!(floor_ppm(0.000_001_9), 1);
    }
}
