# syntax=docker/dockerfile:1
# The platform's image: every in-cluster binary (image/binaries.txt) at /, on a runtime
# root of Debian packages (image/rootfs.sh: glibc, libgcc, CA certificates; no shell, no
# package manager), running as nonroot (65532). Each chart picks its binary as the
# container's command. The release workflow builds it per architecture on native
# runners; the image test (tests/e2e/tests/e2e/image.rs, run by scripts/test.sh) assembles
# the same layout from the debug binaries on machines without a container engine, pushes
# it to a loopback registry, pulls it back and runs every binary from its root.
#
#   docker build -t kubeairunway:dev .
#   docker build --target dist --output type=local,dest=dist .   # the binaries alone

# The Rust toolchain the release is built with (rust-version in Cargo.toml is the minimum).
ARG RUST_VERSION=1.95.0
ARG DEBIAN_SUITE=trixie

# kernelcache-noop is built apart, statically linked: warmup pods copy it into images
# without a C library (distroless, scratch) and run it as their command.
FROM docker.io/library/rust:${RUST_VERSION}-${DEBIAN_SUITE} AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    set -eu; \
    bins=$(grep -v '^\s*\(#\|$\)' image/binaries.txt); \
    cargo build --release --locked $(printf -- '--bin %s ' $bins); \
    mkdir -p /out; \
    for b in $bins; do install -m 0755 "target/release/$b" /out/; done; \
    host=$(rustc -vV | sed -n 's/^host: //p'); \
    RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked \
      -p kubeairunway-noop --target "$host"; \
    install -m 0755 "target/$host/release/kernelcache-noop" /out/

# The binaries alone (attached to the release).
FROM scratch AS dist
COPY --from=build /out/ /

# The runtime root, for the target architecture, fetched on the build platform.
FROM --platform=$BUILDPLATFORM docker.io/library/debian:${DEBIAN_SUITE}-slim AS rootfs
ARG TARGETARCH
COPY image/ /image/
RUN bash /image/rootfs.sh /rootfs "${TARGETARCH}"

FROM scratch
COPY --from=rootfs /rootfs/ /
COPY --from=build /out/ /
USER 65532:65532
WORKDIR /
CMD ["/kubeairunway-controller"]
LABEL org.opencontainers.image.source="https://github.com/kubeairunway/kubeairunway" \
      org.opencontainers.image.description="kubeairunway: core controller, providers and kernel-cache components" \
      org.opencontainers.image.licenses="Apache-2.0"
