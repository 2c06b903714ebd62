//! The home's side of one limit across regions (`[home]`): a region's reporter is one more
//! holder of the home's quota service, on a stream of the reserved domain
//! `tollgate.regions/<region>/<floor in millionths>`; its bucket ids `{limit, key}` name a
//! global limit and the hex of a key's tail, and stand for that limit's pool of the key, sized
//! by what the floors leave: `(1 - sum of floors) x` the key's numbers. A stream from a
//! region the home does not know, or one that says another floor than the home's table, is
//! refused: that region keeps its floor.

use std::collections::{BTreeMap, HashMap};

use crate::config::regions::{floor_ppm, HomeConfig};
use crate::kinds::Meter;
use crate::policy::limit::{Limit, Numbers};
use crate::policy::rlqs::Mapped;

/// The reserved domain's prefix: a region's stream says `tollgate.regions/<name>/<floor ppm>`.
pub const REGIONS_DOMAIN: &str = "tollgate.regions";

/// The bucket id entry naming the global limit.
pub const LIMIT_ENTRY: &str = "limit";
/// The bucket id entry holding the key's tail, in lower-case hex.
pub const KEY_ENTRY: &str = "key";

/// The home's table of regions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    /// Each region's floor, in millionths.
    floors: BTreeMap<String, u32>,
    /// What the floors leave to move by demand, in millionths.
    rest_ppm: u32,
}

/// Why a region's stream is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegionRefused {
    #[error("{0:?} is no region of this home's [home] regions")]
    Unknown(String),
    #[error("region {region:?} says its floor is {said} millionths, the home's table {table}")]
    Floor {
        region: String,
        said: u32,
        table: u32,
    },
    #[error("{0:?} is not tollgate.regions/<region>/<floor in millionths>")]
    Malformed(String),
}

/// The domain a region's reporter streams in: its name and floor, for the home to check.
pub fn domain_of(region: &str, floor: f64) -> String {
    format!("{REGIONS_DOMAIN}/{region}/{}", floor_ppm(floor))
}

/// Whether `domain` is the reserved one (a region's stream), whatever the rest says.
pub fn is_regions_domain(domain: &str) -> bool {
    domain == REGIONS_DOMAIN || domain.starts_with("tollgate.regions/")
}

impl Home {
    pub fn new(config: &HomeConfig) -> Home {
        let floors: BTreeMap<String, u32> = config
            .regions
            .iter()
            .map(|(name, floor)| (name.clone(), floor_ppm(*floor)))
            .collect();
        let sum: u32 = floors.values().sum();
        Home {
            floors,
            rest_ppm: 1_000_000u32.saturating_sub(sum),
        }
    }

    /// The region a reserved `domain` names, if the home knows it at that floor.
    pub fn admit<'d>(&self, domain: &'d str) -> Result<&'d str, RegionRefused> {
        let malformed = || RegionRefused::Malformed(domain.to_string());
        let rest = domain
            .strip_prefix("tollgate.regions/")
            .ok_or_else(malformed)?;
        let (region, said) = rest.split_once('/').ok_or_else(malformed)?;
        let said: u32 = said.parse().map_err(|_| malformed())?;
        let Some(&table) = self.floors.get(region) else {
            return Err(RegionRefused::Unknown(region.to_string()));
        };
        if said != table {
            return Err(RegionRefused::Floor {
                region: region.to_string(),
                said,
                table,
            });
        }
        Ok(region)
    }

    /// The global limit and key a region's bucket id stands for; `None` when it names no
    /// global limit or its key is not hex.
    pub fn find(&self, bucket: &HashMap<String, String>, limits: &[Limit]) -> Option<Mapped> {
        let name = bucket.get(LIMIT_ENTRY)?;
        let limit = limits
            .iter()
            .position(|l| l.name == *name && matches!(l.meter, Meter::Global(_)))?;
        let tail = from_hex(bucket.get(KEY_ENTRY)?)?;
        Some(Mapped { limit, tail })
    }

    /// A pool's numbers for the key's `numbers`: what the floors leave of them, rounded down.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a burst of at most 10^9 times a fraction of at most 1"
    )]
    pub fn pool_numbers(&self, numbers: Numbers) -> Numbers {
        let rest = f64::from(self.rest_ppm) / 1_000_000.0;
        let burst = (crate::base::rate::count_f64(numbers.burst) * rest).floor() as u64;
        Numbers {
            rate: numbers.rate * rest,
            burst,
            overridden: numbers.overridden,
        }
    }
}

/// A key's tail as a region spells it in a bucket id: lower-case hex.
pub fn to_hex(tail: &[u8]) -> String {
    use std::fmt::Write as _;
    tail.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 1024 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::observe::metrics::Metrics;
    use crate::policy::Policy;

    fn home_policy() -> Policy {
        use figment::providers::Format as _;
        let config: Config = figment::Figment::new()
            .merge(figment::providers::Toml::string(
                r#"
grpc_listen = "127.0.0.1:0"
[[limits]]
name = "per-tenant"
rate = 100
burst = 200
key = ["header:x-tenant"]
scope = "global"
[[limits]]
name = "local"
rate = 1
burst = 1
key = ["ip"]
[home]
regions = { eu-west = 0.2, us-east = 0.2 }
"#,
            ))
            .extract()
            .expect("a config");
        config.validate().expect("valid");
        Policy::compile(&config, &Metrics::new()).expect("a policy")
    }

    #[test]
    fn a_region_is_admitted_at_its_own_floor_only() {
        let policy = home_policy();
        let home = policy.home.as_ref().expect("a home");
        assert_eq!(home.admit(&domain_of("eu-west", 0.2)), Ok("eu-west"));
        assert!(matches!(
            home.admit(&domain_of("eu-west", 0.3)),
            Err(RegionRefused::Floor { .. })
        ));
        assert!(matches!(
            home.admit(&domain_of("ap-south", 0.2)),
            Err(RegionRefused::Unknown(_))
        ));
        assert!(matches!(
            home.admit("tollgate.regions"),
            Err(RegionRefused::Malformed(_))
        ));
    }

    #[test]
    fn bucket_ids_name_global_limits_and_hex_tails() {
        let policy = home_policy();
        let home = policy.home.as_ref().expect("a home");
        let id = |limit: &str, key: &str| -> HashMap<String, String> {
            [
                (LIMIT_ENTRY.to_string(), limit.to_string()),
                (KEY_ENTRY.to_string(), key.to_string()),
            ]
            .into()
        };
        let mapped = home
            .find(&id("per-tenant", &to_hex(b"acme")), &policy.limits)
            .expect("mapped");
        assert_eq!(mapped.limit, 0);
        assert_eq!(mapped.tail, b"acme");
        assert_eq!(home.find(&id("local", "00"), &policy.limits), None);
        assert_eq!(home.find(&id("per-tenant", "0g"), &policy.limits), None);
        assert_eq!(home.find(&id("nope", "00"), &policy.limits), None);
    }

    #[test]
    fn pools_are_what_the_floors_leave() {
        let policy = home_policy();
        let home = policy.home.as_ref().expect("a home");
        let numbers = home.pool_numbers(Numbers {
            rate: 100.0,
            burst: 200,
            overridden: false,
        });
        assert!((numbers.rate - 60.0).abs() < 1e-9, "{numbers:?}");
        assert_eq!(numbers.burst, 120);
    }
}
