//! An envoyproxy/ratelimit config directory as it loads one: every file under it at any depth
//! (its runtime loader walks the tree, each file's key its relative path), entries named `.*`
//! skipped (a ConfigMap's `..data` link and `..<timestamp>` directory), each file one domain.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::yaml_bounds::MAX_YAML_MIB;
use super::{check, from_yaml, RuleConfig};
use crate::base::read::read_capped;
use crate::config::ConfigError;

/// The files served from `dir`, sorted: regular files (or links to one) not named `.*`, in
/// `dir` and in its subdirectories at any depth. As there, a link to a directory is not
/// followed, and a subdirectory named `.*` is not entered.
fn config_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    files.sort();
    Ok(files)
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        // The entry's own type (no link followed): a real directory is walked, a link is
        // served when it leads to a file.
        if entry.file_type()?.is_dir() {
            walk(&path, files)?;
        } else if path.is_file() {
            files.push(path);
        }
    }
    Ok(())
}

/// Reads every file `dir` serves (at any depth, not `.*`) into rules. One domain per file unless
/// `merge_domains` (envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`): then the files of one
/// domain add their descriptors to it, and a descriptor two of them declare is refused, as
/// there.
pub fn read_dir(dir: &Path, merge_domains: bool) -> Result<Vec<RuleConfig>, ConfigError> {
    let at = format!("envoy.config_dir {}", dir.display());
    let files = config_files(dir).map_err(|e| ConfigError::new(&at, e.to_string()))?;
    let mut domains = BTreeMap::new();
    let mut rules = Vec::new();
    for path in files {
        let name = path.display().to_string();
        let (domain, file_rules) = read_file(&path)?;
        match domains.insert(domain.clone(), name.clone()) {
            Some(first) if !merge_domains => {
                return Err(ConfigError::new(
                    name,
                    format!("duplicate domain {domain:?} in config file (also in {first})"),
                ));
            }
            Some(_) => {
                rules.extend(file_rules);
                check(&rules, |_| name.clone())?;
            }
            None => rules.extend(file_rules),
        }
    }
    Ok(rules)
}

/// One YAML file of rules: not read past [`MAX_YAML_MIB`], bounded before parsing (see
/// [`from_yaml`]).
pub fn read_file(path: &Path) -> Result<(String, Vec<RuleConfig>), ConfigError> {
    let name = path.display().to_string();
    let text =
        read_capped(path, MAX_YAML_MIB).map_err(|e| ConfigError::new(&name, e.to_string()))?;
    from_yaml(&name, &text)
}

/// A digest of what `dir` serves: each file's name, where its links lead, its length and
/// modification time. It changes when a file is written, added or removed at any depth, and
/// when a ConfigMap's `..data` link is swapped to a new directory.
pub fn fingerprint(dir: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for path in config_files(dir).unwrap_or_default() {
        path.hash(&mut hasher);
        std::fs::canonicalize(&path).ok().hash(&mut hasher);
        if let Ok(meta) = std::fs::metadata(&path) {
            meta.len().hash(&mut hasher);
            meta.modified().ok().hash(&mut hasher);
        }
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tollgate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn rule(domain: &str, key: &str) -> String {
        format!("domain: {domain}\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: minute, requests_per_unit: 2}}\n")
    }

    #[test]
    fn files_at_any_depth_are_read_and_dot_entries_skipped() {
        let dir = scratch("walk");
        std::fs::write(dir.join("a.yaml"), rule("a", "k")).unwrap();
        std::fs::create_dir_all(dir.join("team-b/deeper")).unwrap();
        std::fs::write(dir.join("team-b/deeper/b.yaml"), rule("b", "k")).unwrap();
        std::fs::create_dir_all(dir.join("..2026_12_06")).unwrap();
        std::fs::write(dir.join("..2026_12_06/c.yaml"), rule("c", "k")).unwrap();
        std::fs::write(dir.join(".hidden.yaml"), "not: [yaml").unwrap();
        // A link to a directory is not followed, as Go's filepath.Walk does not follow it.
        std::os::unix::fs::symlink("..2026_12_06", dir.join("linked")).unwrap();
        let domains: Vec<String> = read_dir(&dir, false)
            .unwrap()
            .into_iter()
            .map(|r| r.domain)
            .collect();
        assert_eq!(domains, ["a", "b"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_change_in_a_nested_file_changes_the_fingerprint() {
        let dir = scratch("fingerprint");
        std::fs::create_dir_all(dir.join("nested")).unwrap();
        std::fs::write(dir.join("nested/b.yaml"), rule("b", "k")).unwrap();
        let before = fingerprint(&dir);
        assert_eq!(fingerprint(&dir), before, "stable while nothing changes");
        std::fs::write(dir.join("nested/b.yaml"), rule("b", "longer-key")).unwrap();
        let written = fingerprint(&dir);
        assert_ne!(written, before, "a nested file written");
        std::fs::create_dir_all(dir.join("nested/more")).unwrap();
        std::fs::write(dir.join("nested/more/c.yaml"), rule("c", "k")).unwrap();
        assert_ne!(fingerprint(&dir), written, "a nested file added");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn one_domain_in_two_files_merges_only_when_asked() {
        let dir = scratch("merge");
        std::fs::write(dir.join("a.yaml"), rule("d", "k1")).unwrap();
        std::fs::write(dir.join("b.yaml"), rule("d", "k2")).unwrap();
        let refused = read_dir(&dir, false).unwrap_err();
        assert!(
            refused.reason.contains("duplicate domain \"d\""),
            "{refused}"
        );
        assert!(refused.key.ends_with("b.yaml"), "{refused}");
        let merged = read_dir(&dir, true).unwrap();
        let described: Vec<String> = merged.iter().map(RuleConfig::describe).collect();
        assert_eq!(described, ["d (k1, *)", "d (k2, *)"]);
        // A descriptor both files declare: refused, naming the second file.
        std::fs::write(dir.join("b.yaml"), rule("d", "k1")).unwrap();
        let refused = read_dir(&dir, true).unwrap_err();
        assert!(
            refused
                .reason
                .contains("duplicate descriptor composite key"),
            "{refused}"
        );
        assert!(refused.key.ends_with("b.yaml"), "{refused}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_oversized_or_too_deep_file_is_refused_before_parsing() {
        let dir = scratch("bounds");
        let big = dir.join("big.yaml");
        std::fs::File::create(&big)
            .unwrap()
            .set_len((MAX_YAML_MIB << 20) + 1)
            .unwrap();
        let refused = read_file(&big).unwrap_err();
        assert!(refused.key.ends_with("big.yaml"));
        assert!(refused.reason.contains("larger than 1 MiB"), "{refused}");
        let deep = dir.join("deep.yaml");
        let n = 100_000;
        std::fs::write(
            &deep,
            format!("domain: d\nmetadata: {}{}\n", "[".repeat(n), "]".repeat(n)),
        )
        .unwrap();
        let refused = read_file(&deep).unwrap_err();
        assert!(refused.key.ends_with("deep.yaml"));
        assert!(refused.reason.contains("deeper than 128"), "{refused}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
