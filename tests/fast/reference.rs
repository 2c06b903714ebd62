//! docs/REFERENCE.md against what the binary really serves and accepts: the metrics it
//! exposes (names, types, labels), the keys of the fully documented config/tollgate.toml, the
//! routes it serves on each listener, the headers `/check` sends and envoyproxy/ratelimit's
//! variables it reads. Also: the repository
//! stands alone, citing no contract document that is not in it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;

use crate::support::limit;
use crate::support::{HttpClient, Tollgate};

const REFERENCE: &str = include_str!("../../docs/REFERENCE.md");

/// The text under one heading of REFERENCE.md (`"## Metrics"`), up to the next heading.
fn section(heading: &str) -> &'static str {
    let heading = format!("\n{heading}\n");
    let start = REFERENCE
        .find(&heading)
        .unwrap_or_else(|| panic!("REFERENCE.md has a heading {heading:?}"))
        + heading.len();
    let rest = &REFERENCE[start..];
    &rest[..rest.find("\n#").unwrap_or(rest.len())]
}

/// The body rows of the markdown tables in `text` (header and separator rows left out), as
/// trimmed cells.
fn rows(text: &str) -> Vec<Vec<&str>> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        let Some(inner) = line.trim().strip_prefix('|') else {
            in_table = false;
            continue;
        };
        let cells: Vec<&str> = inner
            .trim_end_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        if !in_table {
            in_table = true; // the header row
        } else if !cells[0].starts_with("---") {
            rows.push(cells);
        }
    }
    rows
}

/// The `backticked` spans of a cell.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The first cell of each row, without its backticks: the names a table documents.
fn first_column(text: &str) -> BTreeSet<String> {
    rows(text)
        .iter()
        .map(|row| row[0].trim_matches('`').to_string())
        .collect()
}

/// Fails naming what only one side has; `what` says what the left side is.
fn assert_same(actual: &BTreeSet<String>, documented: &BTreeSet<String>, what: &str) {
    let missing: Vec<_> = actual.difference(documented).collect();
    let extra: Vec<_> = documented.difference(actual).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what} but not in docs/REFERENCE.md: {missing:?}; in docs/REFERENCE.md only: {extra:?}"
    );
}

#[derive(Debug, PartialEq)]
struct Family {
    kind: String,
    labels: BTreeSet<String>,
}

/// Metric families of a Prometheus text exposition: the `# TYPE` of each, and the label
/// names its samples carry (`le` of histogram buckets left out).
fn families(exposition: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in exposition.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let (name, kind) = declared.split_once(' ').expect("# TYPE <name> <type>");
            families.insert(
                name.into(),
                Family {
                    kind: kind.into(),
                    labels: BTreeSet::new(),
                },
            );
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    name.strip_suffix(suffix)
                        .filter(|base| families.contains_key(*base))
                })
                .unwrap_or(name);
            let labels = line
                .split_once('{')
                .and_then(|(_, rest)| rest.split_once('}'))
                .map(|(labels, _)| labels)
                .unwrap_or_default();
            let names = labels
                .split(',')
                .filter_map(|pair| pair.split_once('=').map(|(name, _)| name.trim()))
                .filter(|name| *name != "le");
            families
                .get_mut(family)
                .unwrap_or_else(|| panic!("{name} has a # TYPE line"))
                .labels
                .extend(names.map(String::from));
        }
    }
    families
}

/// A memory-store tollgate on which every metric has a sample: an exempt request, an allowed
/// and a denied check.
fn exercised_tollgate() -> Tollgate {
    let tollgate = Tollgate::start(
        "[[exempt]]\nname = \"probe\"\nheaders = { \"x-probe\" = [\"yes\"] }\n\n\
         [[limits]]\nname = \"per-ip\"\nrate = 0.01\nburst = 1\nkey = [\"ip\"]\n",
    );
    assert_eq!(tollgate.check(&[("x-probe", "yes")]).status, 200);
    assert_eq!(tollgate.check(&[]).status, 200);
    assert_eq!(tollgate.check(&[]).status, 429);
    tollgate
}

#[test]
fn the_metrics_table_names_every_exposed_metric_with_its_type_and_labels() {
    let tollgate = exercised_tollgate();
    let exposed = families(&tollgate.metrics());
    let documented: BTreeMap<String, Family> = rows(section("## Metrics"))
        .iter()
        .map(|row| {
            let family = Family {
                kind: row[1].to_string(),
                labels: code_spans(row[2]).into_iter().map(String::from).collect(),
            };
            (row[0].trim_matches('`').to_string(), family)
        })
        .collect();
    let names = |families: &BTreeMap<String, Family>| -> BTreeSet<String> {
        families.keys().cloned().collect()
    };
    assert_same(
        &names(&exposed),
        &names(&documented),
        "metrics: exposed at /metrics",
    );
    assert_eq!(exposed, documented, "types and labels");
}

/// The keys `config/tollgate.toml` sets or shows commented out, as REFERENCE.md writes them:
/// `store.url`, `limits[].match.hosts` (`[]` after an array of tables).
fn example_config_keys() -> BTreeSet<String> {
    let example = include_str!("../../config/tollgate.toml");
    let mut arrays = BTreeSet::new();
    let mut table = String::new();
    let mut keys = BTreeSet::new();
    for line in example.lines() {
        // A commented-out line of TOML shows a key too; prose comments do not parse as one.
        let commented = line.starts_with('#');
        let statement = line.trim_start_matches('#').trim();
        if let Some(header) = statement.strip_prefix('[') {
            let is_array = header.starts_with('[');
            let Some(name) = header.trim_start_matches('[').split(']').next() else {
                continue;
            };
            if !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.')
            {
                continue; // prose in brackets
            }
            if is_array {
                arrays.insert(name.to_string());
            }
            table = name.to_string();
            continue;
        }
        let Some((key, _)) = statement.split_once('=') else {
            continue;
        };
        let key = key.trim();
        let is_key = !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !is_key || (commented && !line.starts_with("# ")) {
            continue;
        }
        keys.insert(documented_key(&table, key, &arrays));
    }
    keys
}

fn documented_key(table: &str, key: &str, arrays: &BTreeSet<String>) -> String {
    let mut path = String::new();
    let mut prefix = String::new();
    for part in table.split('.').filter(|p| !p.is_empty()) {
        if !prefix.is_empty() {
            prefix.push('.');
        }
        prefix.push_str(part);
        path.push_str(part);
        if arrays.contains(&prefix) {
            path.push_str("[]");
        }
        path.push('.');
    }
    path + key
}

#[test]
fn the_configuration_table_names_every_key_of_the_documented_example() {
    let example = example_config_keys();
    assert!(
        example.contains("client_ip.ipv6_prefix")
            && example.contains("limits[].match.hosts")
            && example.contains("exempt[].cidrs"),
        "the scan finds set, nested and commented-out keys: {example:?}"
    );
    assert_same(
        &example,
        &first_column(section("## Configuration")),
        "configuration keys: in config/tollgate.toml",
    );
}

/// Every path literal given to `resource(`, `route(` or `scope(` in src/http.rs and under
/// src/http/.
fn routed_paths() -> BTreeSet<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    text_files(&src.join("http"), &mut files);
    text_files(&src.join("http.rs"), &mut files);
    let mut paths = BTreeSet::new();
    for (_, source) in &files {
        for call in ["resource(\"", "route(\"", "scope(\""] {
            for (at, _) in source.match_indices(call) {
                let literal = &source[at + call.len()..];
                if let Some(end) = literal.find('"') {
                    paths.insert(literal[..end].to_string());
                }
            }
        }
    }
    paths
}

/// A documented path as a request path: placeholders filled with the configured limit's name
/// and a sample tail.
fn concrete(path: &str) -> String {
    let mut out = String::new();
    let mut rest = path.replace("<anything>", "api/items");
    while let Some(open) = rest.find('{') {
        let close = rest[open..].find('}').map_or(rest.len(), |c| open + c + 1);
        out.push_str(&rest[..open]);
        out.push_str("per-ip");
        rest = rest[close..].to_string();
    }
    out + &rest
}

/// The HTTP rows of the endpoints table: (listener, method, path).
fn http_endpoints() -> Vec<(String, String, String)> {
    rows(section("## Endpoints"))
        .iter()
        .filter(|row| row[0] != "grpc")
        .map(|row| {
            (
                row[0].into(),
                row[1].into(),
                row[2].trim_matches('`').into(),
            )
        })
        .collect()
}

#[test]
fn every_route_is_documented_and_answers_on_its_listener_only() {
    let endpoints = http_endpoints();
    let routed = routed_paths();
    assert!(
        routed.contains("/metrics"),
        "the scan finds routes: {routed:?}"
    );
    for path in routed {
        assert!(
            endpoints.iter().any(|(_, _, p)| p.ends_with(&path)),
            "{path} is routed but not in REFERENCE.md's endpoints"
        );
    }
    let tollgate = exercised_tollgate();
    let listener = |name: &str| -> SocketAddr {
        match name {
            "public" => tollgate.addr,
            "admin" => tollgate.admin,
            other => panic!("unknown listener {other:?}"),
        }
    };
    for (_, method, path) in &endpoints {
        let method = if method == "any" { "PUT" } else { method };
        let path = concrete(path);
        for name in ["public", "admin"] {
            let status = HttpClient::connect(listener(name))
                .and_then(|mut client| client.request(method, &path, &[]))
                .expect("answered")
                .status;
            let served_here = endpoints
                .iter()
                .any(|(l, _, p)| l == name && concrete(p) == path);
            if served_here {
                assert!(
                    status != 404 && status != 405,
                    "{method} {path} on the {name} listener: {status}"
                );
            } else {
                assert_eq!(status, 404, "{method} {path} is not on the {name} listener");
            }
        }
    }
}

/// The table of envoyproxy/ratelimit's variables is the code's table, rendered: every
/// variable, its default, the key it sets, its Go type, when it is read and refused.
#[test]
fn the_erl_environment_table_is_the_one_the_code_reads() {
    let documented: String = section("### envoyproxy/ratelimit's environment")
        .lines()
        .filter(|line| line.starts_with('|'))
        .map(|line| format!("{line}\n"))
        .collect();
    let table = tollgate_core::erl::config::env::reference_table();
    assert!(
        documented == table,
        "docs/REFERENCE.md's table of envoyproxy/ratelimit's environment differs from the code's \
         (crates/tollgate-core/src/erl/config/env.rs); the code's renders as:\n{table}"
    );
}

#[test]
fn the_headers_table_names_every_header_check_sends() {
    let in_flight = "[[limits]]\nname = \"in-flight\"\nconcurrency = 100\nkey = [\"ip\"]\n\
                     [[limits]]\nname = \"reserving\"\nrate = 1\nburst = 100\n\
                     charge = \"report\"\nreserve = 1\nkey = [\"ip\"]\n";
    // Every header family, the `ratelimit` one (off by default) included.
    let families = "[response]\nheaders = [\"ietf\", \"x-ratelimit\", \"ratelimit\"]\n";
    let tollgate = Tollgate::start(&format!(
        "{families}{}{in_flight}",
        limit("per-ip", 0.01, 1, &["ip"])
    ));
    let mut client = tollgate.client();
    let allowed = client.get("/check", &[]).unwrap();
    let denied = client.get("/check", &[]).unwrap();
    let for_nginx = client
        .get("/check", &[("X-Tollgate-Deny-Status", "403")])
        .unwrap();
    assert_eq!(
        (allowed.status, denied.status, for_nginx.status),
        (200, 429, 403)
    );
    // What any HTTP server sends, not part of the contract.
    let generic = ["content-length", "date", "connection", "keep-alive"];
    let sent: BTreeSet<String> = [&allowed, &denied, &for_nginx]
        .iter()
        .flat_map(|response| response.headers.iter().map(|(name, _)| name.clone()))
        .filter(|name| !generic.contains(&name.as_str()))
        .collect();
    let documented: BTreeSet<String> = first_column(section("### What `/check` answers"))
        .into_iter()
        .map(|header| header.to_ascii_lowercase())
        .collect();
    assert_same(&sent, &documented, "headers: sent by /check");
}

/// Every text file under `dir` (a file or a directory), recursively.
fn text_files(dir: &Path, found: &mut Vec<(String, String)>) {
    if dir.is_file() {
        if let Ok(text) = std::fs::read_to_string(dir) {
            found.push((dir.display().to_string(), text));
        }
        return;
    }
    for entry in std::fs::read_dir(dir)
        .expect("readable directory")
        .flatten()
    {
        text_files(&entry.path(), found);
    }
}

/// Whether `word` stands in `line` as a word of its own, not inside an identifier.
fn has_word(line: &str, word: &str) -> bool {
    let is_word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    line.match_indices(word).any(|(at, _)| {
        !is_word(line[..at].chars().next_back()) && !is_word(line[at + word.len()..].chars().next())
    })
}

#[test]
fn the_repository_cites_no_document_outside_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for place in [
        "README.md",
        "CHANGELOG.md",
        "docs",
        "src",
        "crates",
        "tests",
        "config",
        "k8s",
    ] {
        if root.join(place).exists() {
            text_files(&root.join(place), &mut files);
        }
    }
    // Spelled in pieces, so that this file does not cite them either.
    let upper = concat!("SP", "EC");
    let section_sign = '\u{a7}';
    let card = concat!("design", " card");
    for (path, text) in &files {
        for (number, line) in text.lines().enumerate() {
            assert!(
                !has_word(line, upper)
                    && !line.contains(section_sign)
                    && !line.to_lowercase().contains(card),
                "{path}:{}: {line}",
                number + 1
            );
        }
    }
}
