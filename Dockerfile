# syntax=docker/dockerfile:1
# kafka-assigner image: `kafka-assigner serve` (default) and the example consumer, on an
# empty (`scratch`) base: the two binaries, the libraries they link, a non-root user.
#
#   docker build -t kafka-assigner:local .
#   docker run -p 50051:50051 -p 9090:9090 kafka-assigner:local serve --topic-partitions events=6
#
# Where no registry is reachable, scripts/images builds the same runtime stage (everything
# from the "runtime" line down) from this machine's release build instead; see
# docs/containers.md. Keep that stage self-contained: it may only use the `rootfs` stage.

# ---- build ----------------------------------------------------------------------------
# The toolchain the project is tested with (rust-version in Cargo.toml is the minimum).
FROM rust:1.95-bookworm AS build
WORKDIR /src
# librdkafka is built from source by rdkafka-sys (make, a C/C++ compiler: in this image);
# protoc is vendored (tools/protoc).
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin kafka-assigner --example consumer \
    && scripts/rootfs /rootfs \
        target/release/kafka-assigner:/usr/local/bin/kafka-assigner \
        target/release/examples/consumer:/usr/local/bin/kafka-assigner-example-consumer

# The files of the image (binaries, their libraries, /etc/passwd with user 10001).
FROM scratch AS rootfs
COPY --from=build /rootfs /

# ---- runtime (shared with scripts/images: keep everything below self-contained) --------
FROM scratch
COPY --from=rootfs / /
USER 10001:10001
# In a container the listeners must not be on loopback only. `kafka-assigner probe` (the
# healthcheck) reads the same KAFKA_ASSIGNER_ADMIN_ADDR and probes it on 127.0.0.1.
ENV PATH=/usr/local/bin \
    KAFKA_ASSIGNER_GRPC_ADDR=0.0.0.0:50051 \
    KAFKA_ASSIGNER_ADMIN_ADDR=0.0.0.0:9090
EXPOSE 50051 9090
# No shell and no curl in the image: the binary probes its own admin /ready (exit 0 when
# ready, 1 with the reason otherwise). A probe costs a few milliseconds.
HEALTHCHECK --interval=2s --timeout=3s --start-period=30s --retries=3 \
    CMD ["kafka-assigner", "probe"]
ENTRYPOINT ["kafka-assigner"]
CMD ["serve"]
