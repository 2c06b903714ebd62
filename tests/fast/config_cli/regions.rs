//! `[region]`, `[home]` and a limit's `scope`: every refusal exits 2 with one line naming its
//! key.

use super::*;

const GLOBAL: &str =
    "[[limits]]\nname = \"t\"\nrate = 10\nburst = 20\nkey = [\"header:x-t\"]\nscope = \"global\"\n";
const REGION: &str = "[region]\nname = \"eu-west\"\nhome = \"127.0.0.1:9\"\nfloor = 0.25\n";
const HOME: &str = "grpc_listen = \"127.0.0.1:0\"\n";

#[test]
fn a_region_and_a_home_validate() {
    for config in [
        format!("{GLOBAL}{REGION}"),
        format!("{HOME}{GLOBAL}[home]\nregions = {{ eu-west = 0.25, us-east = 0.75 }}\n"),
    ] {
        let output = run(&["validate"], Some(&config), &[]);
        assert!(output.status.success(), "{config}: {}", stderr(&output));
    }
}

/// A global limit borrows when it says `borrow = true` (its slices count against the share in
/// force, docs/DESIGN.md), not by default: `validate` says which, and why.
#[test]
fn a_global_limit_borrows_when_it_says_so() {
    let store = "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:9/0\"\n";
    for (limit, shown) in [
        (
            GLOBAL.to_string(),
            "t: off: a global limit borrows only with limits.t.borrow = true",
        ),
        (
            GLOBAL.replace("burst = 20", "burst = 20\nborrow = true"),
            "t: on",
        ),
    ] {
        let output = run(&["validate"], Some(&format!("{store}{limit}{REGION}")), &[]);
        assert!(output.status.success(), "{limit}: {}", stderr(&output));
        let out = String::from_utf8_lossy(&output.stdout);
        assert!(
            out.lines()
                .any(|l| l.starts_with("borrowing") && l.ends_with(shown)),
            "{shown}: {out}"
        );
    }
}

#[test]
fn bad_regions_are_refused_naming_the_key() {
    let home = |regions: &str| format!("{HOME}{GLOBAL}[home]\nregions = {{ {regions} }}\n");
    let cases: Vec<(String, &str)> = vec![
        (
            format!("{GLOBAL}{}", REGION.replace("0.25", "1.5")),
            "region.floor",
        ),
        (
            format!("{GLOBAL}{}", REGION.replace("0.25", "0")),
            "region.floor",
        ),
        (
            format!("{GLOBAL}{}", REGION.replace("eu-west", "EU")),
            "region.name",
        ),
        (
            format!("{GLOBAL}{}", REGION.replace("127.0.0.1:9", "")),
            "region.home",
        ),
        (
            format!("{GLOBAL}{REGION}report_every_ms = 1\n"),
            "region.report_every_ms",
        ),
        (home("a = 0.5, b = 0.6"), "home.regions"),
        (home("a = 1.2"), "home.regions.a"),
        (home("a = 0.5, a = 0.2"), "duplicate key `a`"),
        (home("a_b = 0.5"), "home.regions.a_b"),
        (format!("{GLOBAL}[home]\nregions = {{ a = 0.5 }}\n"), "home"),
        (
            format!("{GLOBAL}{REGION}[region.tls]\ncert_file = \"/etc/hostname\"\n"),
            "region.tls.key_file",
        ),
        (
            format!("{GLOBAL}{REGION}[region.tls]\nca_file = \"/nonexistent/ca.pem\"\n"),
            "region.tls.ca_file",
        ),
        (GLOBAL.to_string(), "limits.t.scope"),
        (
            format!(
                "{}{REGION}",
                GLOBAL.replace("burst = 20", "burst = 20\nquota = 5\nperiod = \"hour\"")
            ),
            "limits.t.scope",
        ),
        (
            format!(
                "{}{REGION}",
                GLOBAL.replace("rate = 10\nburst = 20", "concurrency = 5")
            ),
            "limits.t.scope",
        ),
        (
            format!("{HOME}{GLOBAL}{REGION}[home]\nregions = {{ eu-west = 0.25 }}\n"),
            "home",
        ),
    ];
    for (config, key) in &cases {
        assert_refused(&run(&["validate"], Some(config), &[]), key);
    }
}
