#!/usr/bin/env bash
# Fails when a dependency a package declares is named nowhere in that package's code: a crate
# that compiles into every build for nothing, or that a rewrite left behind. A crate is used
# when its name (dashes as underscores) appears as a path (`name::`) or in a `use`/`extern
# crate`. rustls is declared only to pick its crypto provider for redis's TLS, and is exempt.
set -euo pipefail
cd "$(dirname "$0")/.."

exempt=" rustls "
unused=()
# Each package: its manifest's folder, and where its code is (the server's tests and benches
# are its own).
for package in . crates/tollgate-core crates/tollgate-erl; do
  deps=$(sed -n '/^\[\(dev-\)\{0,1\}dependencies\]/,/^\[/p' "$package/Cargo.toml" \
    | sed -n 's/^\([A-Za-z0-9_-]\+\) *=.*/\1/p' | sort -u)
  for dep in $deps; do
    [[ $exempt == *" $dep "* ]] && continue
    name=${dep//-/_}
    if ! (cd "$package" && grep -rqE \
        "(^|[^A-Za-z0-9_])${name}::|use ${name}\b|extern crate ${name}\b|#\[${name}::" \
        src tests benches examples build.rs 2>/dev/null); then
      unused+=("$package: $dep")
    fi
  done
done
if [ "${#unused[@]}" -gt 0 ]; then
  printf 'declared but used nowhere: %s\n' "${unused[@]}" >&2
  exit 1
fi
