# syntax=docker/dockerfile:1
#
# tollgate image: a release build on Debian bookworm, run on distroless/cc (glibc, no shell,
# no package manager) as a non-root user. Build from the repository root:
#   docker build -t tollgate:dev .

# The builder's Debian release must match the runtime's (bookworm = debian12): the binary
# links the system glibc dynamically. Nothing else is linked (no OpenSSL). The toolchain is
# the one the tests run on; Cargo.lock's actix crates need at least 1.89.
ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src

# Dependencies first, in their own layer, so editing the sources does not rebuild them: the
# three packages' manifests over empty sources.
COPY Cargo.toml Cargo.lock ./
COPY crates/tollgate-core/Cargo.toml crates/tollgate-core/
COPY crates/tollgate-erl/Cargo.toml crates/tollgate-erl/
RUN for package in . crates/tollgate-core crates/tollgate-erl; do \
        mkdir -p "$package/src" && touch "$package/src/lib.rs"; \
    done \
    && echo 'fn main() {}' > src/main.rs \
    && cargo build --release --locked \
    && rm -rf src crates/tollgate-core/src crates/tollgate-erl/src

COPY lua ./lua
COPY crates ./crates
COPY src ./src
# touch: the dummy build above left newer timestamps than the copied sources.
RUN touch src/main.rs src/lib.rs crates/tollgate-core/src/lib.rs crates/tollgate-erl/src/lib.rs \
    && cargo build --release --locked \
    && install -D -m 0755 target/release/tollgate /out/tollgate \
    && mkdir -p /out/bin \
    && ln -s /usr/local/bin/tollgate /out/bin/ratelimit

# distroless/cc: glibc and CA certificates only (for rediss://), 65532 = "nonroot".
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/tollgate /usr/local/bin/tollgate
# /bin/ratelimit: the command Envoy Gateway runs for envoyproxy/ratelimit's image; the same
# binary (a link, copied as one), which serves when given no subcommand.
COPY --from=build /out/bin/ /bin/
COPY config/tollgate.toml /etc/tollgate/tollgate.toml
ENV TOLLGATE_CONFIG=/etc/tollgate/tollgate.toml
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 65532:65532
# 8080: /check, /healthz, /readyz (the ingress). 9090: /metrics (Prometheus), never public.
EXPOSE 8080 9090
# tollgate drains in-flight checks on SIGTERM (at most 10 s) and exits 0.
STOPSIGNAL SIGTERM
# No HEALTHCHECK: the image has no shell or curl, and Kubernetes probes /healthz and /readyz.
ENTRYPOINT ["/usr/local/bin/tollgate"]
CMD ["serve"]
