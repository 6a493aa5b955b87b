# Eddy's server image, built by server/docker/build-images from a prebuilt binary (no Rust
# toolchain inside, no image registry): the build context holds `eddy` (its debug info
# stripped), `eddy-entrypoint` and `eddy-healthcheck`. BASE is the Debian bookworm image
# build-images bootstraps with mmdebstrap; it holds every library eddy links.

ARG BASE=eddy-debian:bookworm

# Stage 1: the binary and the shared libraries it needs, found with ldd, with bash (for the
# entrypoint and the health check) and its own, and a passwd that knows `eddy`.
FROM ${BASE} AS collect
# build-images prunes the untagged images that carry this label (old builds, this stage).
LABEL eddy.build=server
COPY eddy eddy-entrypoint eddy-healthcheck /out/usr/local/bin/
RUN set -eu; \
    chmod 0755 /out/usr/local/bin/*; \
    for exe in /out/usr/local/bin/eddy /bin/bash; do \
      if ldd "$exe" | grep 'not found'; then \
        echo "$exe needs libraries the base lacks (see above)" >&2; exit 1; \
      fi; \
    done; \
    libs=$( { ldd /out/usr/local/bin/eddy; ldd /bin/bash; } | \
            awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u); \
    for lib in $libs; do \
      mkdir -p "/out$(dirname "$lib")"; \
      cp -L "$lib" "/out$lib"; \
    done; \
    mkdir -p /out/bin /out/etc/ssl/certs /out/tmp /out/var/lib/eddy; \
    cp /bin/bash /out/bin/bash; \
    ln -s bash /out/bin/sh; \
    cp /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/; \
    printf 'root:x:0:0:root:/root:/bin/bash\neddy:x:10001:10001:eddy:/var/lib/eddy:/bin/bash\n' \
      > /out/etc/passwd; \
    printf 'root:x:0:\neddy:x:10001:\n' > /out/etc/group; \
    printf 'passwd: files\ngroup: files\nhosts: files dns\n' > /out/etc/nsswitch.conf; \
    chmod 1777 /out/tmp; \
    chown 10001:10001 /out/var/lib/eddy; \
    /out/usr/local/bin/eddy --version

# Stage 2: only what stage 1 collected.
FROM scratch
LABEL eddy.build=server
COPY --from=collect /out/ /
ENV PATH=/usr/local/bin:/bin \
    EDDY_DATA_DIR=/var/lib/eddy \
    EDDY_PG_ADDR=0.0.0.0:5433 \
    EDDY_HTTP_ADDR=0.0.0.0:9464 \
    EDDY_PEER_ADDR=0.0.0.0:7000
USER eddy
WORKDIR /var/lib/eddy
VOLUME /var/lib/eddy
# PostgreSQL protocol, GET /metrics, node-to-node gRPC (cluster mode).
EXPOSE 5433 9464 7000
# GET /metrics through bash's /dev/tcp (server/docker/eddy-healthcheck): no curl needed.
HEALTHCHECK --interval=5s --timeout=5s --start-period=120s --retries=3 \
  CMD ["/usr/local/bin/eddy-healthcheck"]
ENTRYPOINT ["/usr/local/bin/eddy-entrypoint"]
CMD ["serve"]
