//! Bounds on an envoyproxy/ratelimit YAML file, checked before the parser sees it: the YAML
//! parser scans nested flow collections (`[[[...`) in quadratic time before its own recursion
//! limit applies, so a small hostile file could hold a reload (or `import`) for minutes.

use std::marker::PhantomData;
use std::mem::MaybeUninit;

use unsafe_libyaml as unsafe_yaml;

/// The largest file served or imported; real rule files are a few kB.
pub const MAX_YAML_MIB: u64 = 1;

/// The largest input `import` reads (Ingress dumps of a whole cluster are larger than rules).
pub const MAX_IMPORT_MIB: u64 = 64;

/// The deepest nesting of collections, block and flow together: the parser's own recursion
/// limit, so no file it would accept is refused here.
pub const MAX_YAML_DEPTH: usize = 128;

/// Refuses `text` when it is larger than [`MAX_YAML_MIB`] or nests deeper than
/// [`MAX_YAML_DEPTH`].
pub fn check(text: &str) -> Result<(), String> {
    if text.len() as u64 > MAX_YAML_MIB << 20 {
        return Err(format!(
            "larger than {MAX_YAML_MIB} MiB; refused before parsing"
        ));
    }
    check_depth(text)
}

/// Refuses `text` when it nests collections deeper than [`MAX_YAML_DEPTH`], as the YAML
/// parser's own scanner reads it (libyaml's, which the parser runs): a scan of our own that
/// guessed where quotes, comments, plain and block scalars begin and end could be led to take
/// real brackets for text (`[x:', [[[...` is a plain scalar `x:'` and then real nesting). The
/// scanner alone is linear while the nesting is bounded, and it stops at the first level past
/// the bound. It counts the collections it opens a token for; the parser opens a few more
/// (a sequence indented no deeper than its key, a single pair in a flow sequence), so nothing
/// the parser accepts is refused here. What the scanner cannot read is left to the parser,
/// which stops there too.
pub fn check_depth(text: &str) -> Result<(), String> {
    let mut depth = 0usize;
    for token in Tokens::new(text) {
        match token {
            unsafe_yaml::YAML_FLOW_SEQUENCE_START_TOKEN
            | unsafe_yaml::YAML_FLOW_MAPPING_START_TOKEN
            | unsafe_yaml::YAML_BLOCK_SEQUENCE_START_TOKEN
            | unsafe_yaml::YAML_BLOCK_MAPPING_START_TOKEN => {
                depth += 1;
                if depth > MAX_YAML_DEPTH {
                    return Err(too_deep());
                }
            }
            unsafe_yaml::YAML_FLOW_SEQUENCE_END_TOKEN
            | unsafe_yaml::YAML_FLOW_MAPPING_END_TOKEN
            | unsafe_yaml::YAML_BLOCK_END_TOKEN => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// The kinds of libyaml's tokens for a text, up to the end of the stream or the first error.
struct Tokens<'t> {
    /// Boxed: the parser points at itself once given its input, so it must not move.
    parser: Box<MaybeUninit<unsafe_yaml::yaml_parser_t>>,
    initialized: bool,
    done: bool,
    _text: PhantomData<&'t str>,
}

impl<'t> Tokens<'t> {
    fn new(text: &'t str) -> Tokens<'t> {
        let mut parser = Box::new(MaybeUninit::<unsafe_yaml::yaml_parser_t>::uninit());
        let raw = parser.as_mut_ptr();
        // SAFETY: `raw` is valid for writes and initialized here before any other use; the
        // input is `text`, which outlives `self` ('t), with its own length.
        let initialized = unsafe {
            let initialized = unsafe_yaml::yaml_parser_initialize(raw).ok;
            if initialized {
                unsafe_yaml::yaml_parser_set_encoding(raw, unsafe_yaml::YAML_UTF8_ENCODING);
                unsafe_yaml::yaml_parser_set_input_string(raw, text.as_ptr(), text.len() as u64);
            }
            initialized
        };
        Tokens {
            parser,
            initialized,
            done: !initialized,
            _text: PhantomData,
        }
    }
}

impl Iterator for Tokens<'_> {
    type Item = unsafe_yaml::yaml_token_type_t;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let mut token = MaybeUninit::<unsafe_yaml::yaml_token_t>::uninit();
        // SAFETY: the parser was initialized with its input (`done` is false); the scanner
        // writes a whole token (zeroed first) or fails, and a token written is freed once here.
        let kind = unsafe {
            if unsafe_yaml::yaml_parser_scan(self.parser.as_mut_ptr(), token.as_mut_ptr()).fail {
                None
            } else {
                let kind = (*token.as_ptr()).type_;
                unsafe_yaml::yaml_token_delete(token.as_mut_ptr());
                Some(kind)
            }
        };
        self.done = matches!(
            kind,
            None | Some(unsafe_yaml::YAML_STREAM_END_TOKEN | unsafe_yaml::YAML_NO_TOKEN)
        );
        kind
    }
}

impl Drop for Tokens<'_> {
    fn drop(&mut self) {
        if self.initialized {
            // SAFETY: initialized in `new`, deleted once.
            unsafe { unsafe_yaml::yaml_parser_delete(self.parser.as_mut_ptr()) }
        }
    }
}

fn too_deep() -> String {
    format!("nested deeper than {MAX_YAML_DEPTH} levels; refused before parsing")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_flow_and_block_nesting_is_refused_before_parsing() {
        let flow = |n: usize| format!("domain: d\nmetadata: {}{}\n", "[".repeat(n), "]".repeat(n));
        assert!(check_depth(&flow(100)).is_ok());
        assert!(check_depth(&flow(100_000))
            .unwrap_err()
            .contains("deeper than 128"));
        let block: String = (0..200)
            .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
            .collect();
        assert!(check_depth(&block).is_err());
        let compact = format!("x:\n{}a\n", "- ".repeat(200));
        assert!(check_depth(&compact).is_err());
    }

    #[test]
    fn brackets_in_strings_comments_and_plain_scalars_do_not_count() {
        let deep = "[".repeat(300);
        for yaml in [
            format!("domain: d\nmetadata: {{note: \"{deep}\"}}\n"),
            format!("domain: d\nmetadata: {{note: '{deep}'}}\n"),
            format!("domain: d # {deep}\n"),
            format!("domain: d\nvalue: a{deep}\n"),
            format!("domain: d\nvalue: \"esc \\\" {deep}\"\n"),
            format!("domain: d\nvalue: 'it''s {deep}'\n"),
        ] {
            assert!(check_depth(&yaml).is_ok(), "{yaml}");
        }
        // What looks like a quote, a comment or a block scalar to a scan that is not YAML's
        // own, but is not one to the parser: the brackets after it are real.
        let nested = format!("{deep}{}", "]".repeat(300));
        for yaml in [
            format!("domain: d\nmetadata: [x:', {nested}]\n"),
            format!("domain: d\nmetadata: [x:\", {nested}]\n"),
            format!("domain: d\nmetadata: [x:#, {nested}]\n"),
            format!("domain: d\nnote: x:'y\nmetadata: {nested}\n"),
            format!("domain: d\nnote: x\n  'y\nmetadata: {nested}\n"),
            format!("domain: d\nnote: -'y\nmetadata: {nested}\n"),
            format!("domain: d\nnote: !t'y\nmetadata: {nested}\n"),
            format!("domain: d\nnote: |\n  'y\nmetadata: {nested}\n"),
            format!("domain: d\nmetadata: [a,#b\n  {nested}]\n"),
        ] {
            assert!(check_depth(&yaml).is_err(), "{yaml}");
        }
    }

    /// Every YAML file this repository ships or tests with (rule files, Envoy, Traefik and
    /// Kubernetes configs; not Helm templates, which are not YAML until rendered).
    #[test]
    fn the_repository_s_own_yaml_passes() {
        fn walk(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).expect("a directory").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    if !path.ends_with("templates") {
                        walk(&path, found);
                    }
                } else if path
                    .extension()
                    .is_some_and(|ext| ext == "yaml" || ext == "yml")
                {
                    found.push(path);
                }
            }
        }
        // The repository's top, two levels above this package.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut files = Vec::new();
        for dir in ["tests/fixtures", "config", "k8s", "charts", "examples"] {
            walk(&root.join(dir), &mut files);
        }
        assert!(files.len() > 20, "{files:?}");
        for file in files {
            let text = std::fs::read_to_string(&file).expect("readable");
            assert_eq!(check(&text), Ok(()), "{}", file.display());
        }
    }

    #[test]
    fn a_shipped_style_rule_file_passes() {
        let yaml = "domain: rl\ndescriptors:\n  - key: a\n    value: x\n    descriptors:\n      - key: b\n        rate_limit:\n          unit: minute\n          requests_per_unit: 5\n    metadata: {team: {name: [1, {x: 2}]}}\n";
        assert!(check_depth(yaml).is_ok());
    }
}
