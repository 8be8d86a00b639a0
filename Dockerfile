# drivelet node agent image.
# Build stage: compile the release binary.
FROM rust:1-bookworm AS build
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      protobuf-compiler libprotobuf-dev libudev-dev pkg-config && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src src
COPY benches benches
COPY vendor vendor
RUN cargo build --release --locked && strip target/release/drivelet

# Runtime stage: the tools drivelet runs (mkfs, fsck, blkid, losetup, smartctl, udevadm).
FROM debian:bookworm-slim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      libudev1 udev e2fsprogs xfsprogs util-linux smartmontools ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/drivelet /usr/local/bin/drivelet
COPY config/drivelet.toml /etc/drivelet/drivelet.toml
ENTRYPOINT ["/usr/local/bin/drivelet"]
CMD ["run", "--config", "/etc/drivelet/drivelet.toml"]
