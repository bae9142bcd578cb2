# syntax=docker/dockerfile:1
#
# One image for the whole stack: the CLI (`gpusched`), the four deciding
# services, the node agent and the HTTP gateway, all in /usr/local/bin.
# Each docker-compose service picks its binary with `command:`. The node
# agent finds GPUs through NVML (the driver's library, loaded at run time
# when the NVIDIA container runtime provides it; --gpus needs none).
#
#   docker build -t gpusched:dev .
#   docker run --rm gpusched:dev gpusched simulate
#
# See docs/deploy.md.

ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

# ---------------------------------------------------------------- builder --
FROM ${RUST_IMAGE} AS builder
WORKDIR /src

# The whole workspace (see .dockerignore). Besides the crates, the build
# reads docs/clusters/demo.toml (include_str! in shared/sim) and migrations/
# (sqlx::migrate! in shared/store), so both must be in the context.
COPY . .

# Cache mounts keep the crates.io registry and target/ between builds. target/
# lives only in the cache mount, so the binaries are copied out in the same
# step. Package names equal binary names.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    set -eux; \
    bins="gpusched gpusched-admission gpusched-quota gpusched-placement gpusched-preemption gpusched-agent gpusched-gateway"; \
    pkgs=""; \
    for b in $bins; do pkgs="$pkgs -p $b"; done; \
    cargo build --release --locked $pkgs --features gpusched-agent/nvml; \
    mkdir -p /out; \
    for b in $bins; do cp "target/release/$b" /out/; done

# ---------------------------------------------------------------- runtime --
FROM ${RUNTIME_IMAGE}

# ca-certificates for TLS to external endpoints; curl for healthchecks.
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates curl; \
    rm -rf /var/lib/apt/lists/*; \
    groupadd --system --gid 10001 gpusched; \
    useradd --system --uid 10001 --gid gpusched --create-home \
        --home-dir /var/lib/gpusched --shell /usr/sbin/nologin gpusched; \
    install -d -o gpusched -g gpusched /var/lib/gpusched/agent /var/lib/gpusched/checkpoints

COPY --from=builder /out/ /usr/local/bin/
# Example cluster files, for `gpusched-agent --cluster` and `gpusched simulate --cluster`.
COPY docs/clusters/ /usr/share/gpusched/clusters/

LABEL org.opencontainers.image.title="gpusched" \
      org.opencontainers.image.description="Event-sourced GPU batch scheduler" \
      org.opencontainers.image.licenses="Apache-2.0"

# Inside a container the gateway must listen on all interfaces (its own
# default is 127.0.0.1:8080). Only the gateway reads GPUSCHED_LISTEN.
ENV RUST_LOG=info \
    GPUSCHED_LISTEN=0.0.0.0:8080

USER 10001:10001
# Writable working directory, e.g. for `gpusched simulate --report report.json`.
WORKDIR /var/lib/gpusched
EXPOSE 8080
# The services drain and release their leases on SIGTERM.
STOPSIGNAL SIGTERM
CMD ["gpusched", "--help"]
