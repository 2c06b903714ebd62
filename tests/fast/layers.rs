//! The layering of the three packages' sources: every module imports only its own layer's
//! modules and the layers below, and no set of modules imports itself round a cycle. The
//! compiler keeps the packages apart (the core cannot name the server or the ERL wire); the
//! layers inside a package it cannot keep, so this test reads the sources: every `crate::`,
//! `super::`, `self::`, `tollgate_core::` and `tollgate_erl::` path outside comments is an edge
//! from the file to the deepest module it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom to top. A layer may use the ones before it; layers that share a rank may not use
/// each other: `answer` and `otlp` (the top of the core, and the first layer of the server
/// above it, which `state` starts), `http` and `grpc`.
const LAYERS: &[(&str, u8)] = &[
    ("base", 0),
    ("config", 1),
    ("request", 2),
    ("observe", 3),
    ("kinds", 4),
    ("store", 5),
    ("policy", 6),
    ("limiter", 7),
    ("answer", 8),
    ("otlp", 8),
    ("state", 9),
    ("http", 10),
    ("grpc", 10),
    ("app", 11),
    ("cli", 12),
];

/// envoyproxy/ratelimit's compatibility is one wing (`src/erl/`) across the layers: each of
/// its parts is named after the layer it belongs to (`erl::config`, `erl::grpc`) and judged as
/// that layer. The wing's own file (`erl.rs`) only names its parts: judged as the bottom layer.
const WING: &str = "erl";

/// The layers the wing stands on. The others (`otlp`, `state`, `http`, `grpc`, `app`, `cli`)
/// are the server it plugs into: the wing imports none of them, so that it can become a
/// package that depends on the core alone.
const CORE: &[&str] = &[
    "base", "config", "request", "observe", "kinds", "store", "policy", "limiter", "answer",
];

/// Where the core still reaches into the wing, and why: (importer, the wing's module).
/// A package of its own for the wing has to cut each of these first.
const TIES: &[(&str, &str, &str)] = &[
    (
        "config::schema",
        "erl::config",
        "the [envoy] table is a field of the one Config that serde reads whole",
    ),
    (
        "config::load",
        "erl::config::env",
        "ERL's environment applies over the file, inside Config::load",
    ),
    (
        "config::summary",
        "erl::config",
        "validate prints the ERL rules among the limits",
    ),
    (
        "policy",
        "erl::config",
        "Policy::compile reads the ERL rules (files and xDS) to build their limits",
    ),
    (
        "policy",
        "erl::policy",
        "the compiled ERL tree is a field of Policy, swapped with the limits it indexes",
    ),
];

type Module = Vec<String>;

#[test]
fn every_module_imports_only_its_layer_and_the_layers_below() {
    let graph = Graph::read();
    let mut upward = Vec::new();
    for (from, targets) in &graph.edges {
        for to in targets {
            let (Some(a), Some(b)) = (rank(from), rank(to)) else {
                continue;
            };
            if b > a || (a == b && layer(from) != layer(to)) {
                upward.push(format!("{} -> {}", from.join("::"), to.join("::")));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the layers:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_module_imports_itself_round_a_cycle() {
    let graph = Graph::read();
    let cycles = graph.cycles();
    assert!(
        cycles.is_empty(),
        "import cycles:\n{}",
        cycles
            .iter()
            .map(|cycle| cycle
                .iter()
                .map(|m| m.join("::"))
                .collect::<Vec<_>>()
                .join(" -> "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_core_package_depends_on_no_protocol_stack() {
    // The core decides without a protocol: the HTTP framework, the gRPC stack and protobuf
    // stay in the server and the ERL wire, at the edges.
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/tollgate-core/Cargo.toml"),
    )
    .expect("read the core's manifest");
    let named: Vec<&str> = manifest
        .lines()
        .filter_map(|line| line.split(['=', ' ']).next())
        .filter(|name| {
            ["actix-web", "tonic", "prost", "envoy-types", "hyper"]
                .iter()
                .any(|stack| name.starts_with(stack))
        })
        .collect();
    assert!(named.is_empty(), "the core depends on {named:?}");
    assert!(
        manifest.contains("\nredis = "),
        "the reader sees the dependencies"
    );
}

#[test]
fn the_wing_imports_only_the_core() {
    let graph = Graph::read();
    let mut outward = Vec::new();
    for (from, targets) in graph.edges.iter().filter(|(m, _)| m[0] == WING) {
        for to in targets {
            if to[0] != WING && !CORE.contains(&to[0].as_str()) {
                outward.push(format!("{} -> {}", from.join("::"), to.join("::")));
            }
        }
    }
    assert!(
        outward.is_empty(),
        "the wing imports the server:\n{}",
        outward.join("\n")
    );
}

#[test]
fn the_core_reaches_into_the_wing_only_through_its_listed_ties() {
    let graph = Graph::read();
    let mut found = BTreeSet::new();
    for (from, targets) in &graph.edges {
        if from[0] == WING || !CORE.contains(&from[0].as_str()) {
            continue;
        }
        for to in targets.iter().filter(|to| to[0] == WING) {
            found.insert((from.join("::"), to.join("::")));
        }
    }
    let listed: BTreeSet<(String, String)> = TIES
        .iter()
        .map(|(from, to, _)| (from.to_string(), to.to_string()))
        .collect();
    let unlisted: Vec<_> = found.difference(&listed).collect();
    let gone: Vec<_> = listed.difference(&found).collect();
    assert!(
        unlisted.is_empty() && gone.is_empty(),
        "ties of the core to the wing not listed: {unlisted:?}; listed but gone: {gone:?}"
    );
}

#[test]
fn the_reader_sees_the_edges_it_must_judge() {
    // The two tests above pass on an empty graph: prove the reader finds real edges, braces and
    // `super::` included.
    let graph = Graph::read();
    let edges_of = |m: &str| {
        graph.edges[&module(m)]
            .iter()
            .map(|m| m.join("::"))
            .collect::<BTreeSet<_>>()
    };
    assert!(edges_of("limiter").contains("store"));
    assert!(edges_of("config::summary").contains("config"));
    assert!(edges_of("store::memory").contains("kinds::twin"));
    // A module whose tests sit in its folder's `tests.rs` is read from both files.
    assert!(edges_of("cli::replay").contains("policy"));
    // A part of the wing is judged as the layer it is named after.
    assert!(edges_of("erl::grpc::plan").contains("erl::policy"));
    assert_eq!(rank(&module("erl::grpc::plan")), rank(&module("grpc")));
    assert!(graph.edges.len() > 50, "{} modules", graph.edges.len());
    // A new top-level module must be given a layer, or the judge would skip it.
    let unranked: Vec<String> = graph
        .edges
        .keys()
        .filter(|m| rank(m).is_none())
        .map(|m| m.join("::"))
        .collect();
    assert!(unranked.is_empty(), "modules in no layer: {unranked:?}");
}

fn module(path: &str) -> Module {
    path.split("::").map(str::to_string).collect()
}

/// The layer a module belongs to: its top-level module's, or, for a part of the wing, the one
/// it is named after.
fn layer(module: &Module) -> Option<&str> {
    match module.as_slice() {
        [wing, part, ..] if wing == WING => Some(part),
        [wing] if wing == WING => Some(LAYERS[0].0),
        [top, ..] => Some(top),
        [] => None,
    }
}

fn rank(module: &Module) -> Option<u8> {
    let layer = layer(module)?;
    LAYERS
        .iter()
        .find(|(name, _)| *name == layer)
        .map(|&(_, rank)| rank)
}

struct Graph {
    /// Module -> the modules it names (itself excluded).
    edges: BTreeMap<Module, BTreeSet<Module>>,
}

impl Graph {
    fn read() -> Graph {
        let top = Path::new(env!("CARGO_MANIFEST_DIR"));
        // Each package's sources, and where its `crate::` stands in the one tree of modules:
        // the ERL package's modules are the wing's (`erl::grpc`), as they were in one crate.
        let packages: [(PathBuf, Module); 3] = [
            (top.join("crates/tollgate-core/src"), Vec::new()),
            (top.join("crates/tollgate-erl/src"), module(WING)),
            (top.join("src"), Vec::new()),
        ];
        // A module may have two files: its own and a `tests.rs` in its folder.
        let mut modules: Vec<(Module, PathBuf, &Module)> = Vec::new();
        for (src, root) in &packages {
            let mut files = Vec::new();
            collect(src, &mut files);
            for file in files {
                if let Some(module) = module_of(src, root, &file) {
                    modules.push((module, file, root));
                }
            }
        }
        let known: BTreeSet<Module> = modules.iter().map(|(m, _, _)| m.clone()).collect();
        let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
        for (from, file, root) in &modules {
            let text = std::fs::read_to_string(file).expect("read a source file");
            // In a `tests.rs`, as in an inline `mod tests`, `super` is the module itself.
            let tests_file = file.file_stem().is_some_and(|stem| stem == "tests");
            let targets = paths_in(&text)
                .into_iter()
                .filter_map(|(inline, path)| {
                    resolve(from, root, inline || tests_file, &path, &known)
                })
                .filter(|to| to != from);
            edges.entry(from.clone()).or_default().extend(targets);
        }
        Graph { edges }
    }

    /// Strongly connected components of more than one module (Tarjan).
    fn cycles(&self) -> Vec<Vec<Module>> {
        struct Walk<'a> {
            graph: &'a Graph,
            index: BTreeMap<&'a Module, usize>,
            low: BTreeMap<&'a Module, usize>,
            stack: Vec<&'a Module>,
            on_stack: BTreeSet<&'a Module>,
            found: Vec<Vec<Module>>,
        }
        fn visit<'a>(walk: &mut Walk<'a>, node: &'a Module) {
            let n = walk.index.len();
            walk.index.insert(node, n);
            walk.low.insert(node, n);
            walk.stack.push(node);
            walk.on_stack.insert(node);
            for next in walk.graph.edges.get(node).into_iter().flatten() {
                if !walk.index.contains_key(next) {
                    visit(walk, next);
                    let low = walk.low[node].min(walk.low[next]);
                    walk.low.insert(node, low);
                } else if walk.on_stack.contains(next) {
                    let low = walk.low[node].min(walk.index[next]);
                    walk.low.insert(node, low);
                }
            }
            if walk.low[node] == walk.index[node] {
                let mut component = Vec::new();
                while let Some(top) = walk.stack.pop() {
                    walk.on_stack.remove(top);
                    component.push(top.clone());
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    walk.found.push(component);
                }
            }
        }
        let mut walk = Walk {
            graph: self,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            found: Vec::new(),
        };
        for node in self.edges.keys() {
            if !walk.index.contains_key(node) {
                visit(&mut walk, node);
            }
        }
        walk.found
    }
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// `src/policy/limit.rs` -> `policy::limit`, below the package's `root`; `lib.rs` and
/// `main.rs` are no layer's, but the ERL package's `lib.rs` is the wing's own file.
/// A `tests.rs` beside its module's folder is part of that module.
fn module_of(src: &Path, root: &Module, file: &Path) -> Option<Module> {
    let relative = file.strip_prefix(src).ok()?.with_extension("");
    let parts: Module = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    if parts == ["lib"] && !root.is_empty() {
        return Some(root.clone());
    }
    if parts == ["lib"] || parts == ["main"] {
        return None;
    }
    let mut parts: Module = root.iter().cloned().chain(parts).collect();
    if parts.last().is_some_and(|last| last == "tests") {
        parts.pop();
    }
    Some(parts)
}

/// How a path that names a module of tollgate may start: in its own package, or another's.
const HEADS: [&str; 5] = [
    "crate::",
    "super::",
    "self::",
    "tollgate_core::",
    "tollgate_erl::",
];

/// Every `crate::`, `super::`, `self::` and package path outside comments, brace groups expanded one
/// level (`super::{a, b::C}` gives `super::a` and `super::b::C`); with each, whether it stands
/// after an inline `mod name {` (a file's `mod tests`), where `super` is the file's own module.
fn paths_in(text: &str) -> Vec<(bool, Vec<String>)> {
    let mut paths = Vec::new();
    let mut inline = false;
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let trimmed = code.trim_start().trim_start_matches("pub ");
        if trimmed.starts_with("mod ") && trimmed.trim_end().ends_with('{') {
            inline = true;
        }
        let mut rest = code;
        while let Some(at) = HEADS.iter().filter_map(|head| rest.find(head)).min() {
            let before = rest[..at].chars().last();
            let tail = &rest[at..];
            rest = &tail[1..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // `mycrate::`, not `crate::`
            }
            let mut path = Vec::new();
            let mut cursor = tail;
            loop {
                let ident: String = cursor
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if ident.is_empty() {
                    break;
                }
                cursor = &cursor[ident.len()..];
                path.push(ident);
                match cursor.strip_prefix("::") {
                    Some(next) => cursor = next,
                    None => break,
                }
            }
            if let Some(group) = cursor.strip_prefix('{') {
                let group = group.split('}').next().unwrap_or("");
                for item in group.split(',') {
                    let first: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !first.is_empty() {
                        let mut expanded = path.clone();
                        expanded.push(first);
                        paths.push((inline, expanded));
                    }
                }
            } else {
                paths.push((inline, path));
            }
        }
    }
    paths
}

/// The deepest module of `known` that `path`, written in `from` (inside an inline module of
/// it when `inline`) of the package whose `crate::` is `root`, names.
fn resolve(
    from: &Module,
    root: &Module,
    inline: bool,
    path: &[String],
    known: &BTreeSet<Module>,
) -> Option<Module> {
    let (mut base, rest): (Module, &[String]) = match path.first()?.as_str() {
        "crate" => (root.clone(), &path[1..]),
        "tollgate_core" => (Vec::new(), &path[1..]),
        "tollgate_erl" => (module(WING), &path[1..]),
        "self" => (from.clone(), &path[1..]),
        "super" => {
            let mut base = from.clone();
            let mut rest = path;
            if inline {
                rest = &rest[1..];
            }
            while rest.first().is_some_and(|p| p == "super") {
                base.pop();
                rest = &rest[1..];
            }
            (base, rest)
        }
        _ => return None,
    };
    let mut deepest = known.contains(&base).then(|| base.clone());
    for part in rest {
        base.push(part.clone());
        if known.contains(&base) {
            deepest = Some(base.clone());
        } else {
            break;
        }
    }
    deepest
}
