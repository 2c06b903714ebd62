#!/usr/bin/env bash
# Fails when a dependency declared in Cargo.toml is named nowhere in the code: a crate that
# compiles into every build for nothing, or that a rewrite left behind. A crate is used when
# its name (dashes as underscores) appears as a path (`name::`) or in a `use`/`extern crate`.
# rustls is declared only to pick its crypto provider for redis's TLS, and is exempt.
set -euo pipefail
cd "$(dirname "$0")/.."

exempt=" rustls "
deps=$(sed -n '/^\[\(dev-\)\{0,1\}dependencies\]/,/^\[/p' Cargo.toml \
  | sed -n 's/^\([A-Za-z0-9_-]\+\) *=.*/\1/p' | sort -u)
unused=()
for dep in $deps; do
  [[ $exempt == *" $dep "* ]] && continue
  name=${dep//-/_}
  if ! grep -rqE "(^|[^A-Za-z0-9_])${name}::|use ${name}\b|extern crate ${name}\b|#\[${name}::" \
      src tests benches examples build.rs 2>/dev/null; then
    unused+=("$dep")
  fi
done
if [ "${#unused[@]}" -gt 0 ]; then
  echo "declared in Cargo.toml but used nowhere: ${unused[*]}" >&2
  exit 1
fi
