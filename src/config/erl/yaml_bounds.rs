//! Bounds on an envoyproxy/ratelimit YAML file, checked before the parser sees it: the YAML
//! parser scans nested flow collections (`[[[...`) in quadratic time before its own recursion
//! limit applies, so a small hostile file could hold a reload (or `import`) for minutes.

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

/// Refuses `text` when it nests collections deeper than [`MAX_YAML_DEPTH`]. A cheap scan, not
/// a parser: block depth counts the open indentation levels (a compact `- ` opens one more),
/// flow depth the open brackets outside quotes and comments. It may count a level too many for
/// a bracket inside a plain scalar, never one too few.
pub fn check_depth(text: &str) -> Result<(), String> {
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    let mut quote: Option<char> = None;
    for line in text.lines() {
        if flow == 0 && quote.is_none() {
            let body = line.trim_start_matches(' ');
            if body.is_empty() || body.starts_with('#') {
                continue;
            }
            let mut column = line.len() - body.len();
            open_block(&mut indents, column);
            // `- - key: v`: each compact sequence entry is one level deeper.
            let mut rest = body;
            while let Some(after) = rest.strip_prefix("- ").or_else(|| rest.strip_prefix("-\t")) {
                let trimmed = after.trim_start();
                column += rest.len() - trimmed.len();
                open_block(&mut indents, column);
                rest = trimmed;
            }
        }
        flow = scan_flow(line, flow, &mut quote, indents.len())?;
        if indents.len() > MAX_YAML_DEPTH {
            return Err(too_deep());
        }
    }
    Ok(())
}

fn open_block(indents: &mut Vec<usize>, column: usize) {
    while indents.last().is_some_and(|&open| open >= column) {
        indents.pop();
    }
    indents.push(column);
}

/// The flow depth after `line`, from `flow` before it; refuses a depth past the bound with the
/// `block` levels around it. A bracket inside a plain scalar (`a[b`) opens nothing.
fn scan_flow(
    line: &str,
    mut flow: usize,
    quote: &mut Option<char>,
    block: usize,
) -> Result<usize, String> {
    let mut plain = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (*quote, c) {
            (Some('"'), '\\') => {
                chars.next();
            }
            // `''` inside single quotes is a quote, not the end.
            (Some('\''), '\'') if chars.peek() == Some(&'\'') => {
                chars.next();
            }
            (Some(open), c) if c == open => *quote = None,
            (Some(_), _) => {}
            (None, '#') if !plain => break,
            (None, c) if c.is_whitespace() => plain = false,
            (None, ',' | ':') => plain = false,
            (None, '-' | '?') => {}
            (None, '"' | '\'') if !plain => *quote = Some(c),
            (None, '[' | '{') if !plain => {
                flow += 1;
                if block + flow > MAX_YAML_DEPTH {
                    return Err(too_deep());
                }
            }
            (None, ']' | '}') => {
                flow = flow.saturating_sub(1);
                plain = false;
            }
            (None, _) => plain = true,
        }
    }
    Ok(flow)
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
    }

    #[test]
    fn a_shipped_style_rule_file_passes() {
        let yaml = "domain: rl\ndescriptors:\n  - key: a\n    value: x\n    descriptors:\n      - key: b\n        rate_limit:\n          unit: minute\n          requests_per_unit: 5\n    metadata: {team: {name: [1, {x: 2}]}}\n";
        assert!(check_depth(yaml).is_ok());
    }
}
