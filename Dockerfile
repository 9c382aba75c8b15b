# syntax=docker/dockerfile:1
# kafka-assigner image: `kafka-assigner serve` (default) and the example consumer.
#
#   docker build -t kafka-assigner:local .
#   docker run -p 50051:50051 -p 9090:9090 kafka-assigner:local serve --topic-partitions events=6
#
# The admin port's /ready is the healthcheck; it is probed with curl (installed in the
# runtime image), so keep --admin-addr on port 9090 or override HEALTHCHECK.

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
    && mkdir -p /out \
    && cp target/release/kafka-assigner target/release/examples/consumer /out/

# ---- runtime --------------------------------------------------------------------------
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin assigner
COPY --from=build /out/kafka-assigner /usr/local/bin/kafka-assigner
COPY --from=build /out/consumer /usr/local/bin/kafka-assigner-example-consumer
USER 10001:10001
# In a container the listeners must not be on loopback only.
ENV KAFKA_ASSIGNER_GRPC_ADDR=0.0.0.0:50051 \
    KAFKA_ASSIGNER_ADMIN_ADDR=0.0.0.0:9090
EXPOSE 50051 9090
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:9090/ready"]
ENTRYPOINT ["kafka-assigner"]
CMD ["serve"]
