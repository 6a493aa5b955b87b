# A single-node Apache Kafka broker (KRaft, broker and controller in one JVM) for Eddy's
# compose cluster, built by server/docker/build-images: BASE is the Debian bookworm image
# it bootstraps with mmdebstrap (openjdk-17-jre-headless included); the build context holds
# lib/ (the jars `.ci/kafka install` fetched from Maven Central) and kafka-start.
ARG BASE=eddy-debian:bookworm
FROM ${BASE}
LABEL eddy.build=kafka
RUN groupadd --system --gid 10002 kafka \
 && useradd --system --uid 10002 --gid kafka --home-dir /var/lib/kafka --no-create-home \
      --shell /usr/sbin/nologin kafka \
 && mkdir -p /var/lib/kafka \
 && chown kafka:kafka /var/lib/kafka \
 && java -version
COPY lib/ /opt/kafka/lib/
COPY kafka-start /usr/local/bin/kafka-start
USER kafka
WORKDIR /var/lib/kafka
VOLUME /var/lib/kafka
EXPOSE 9092
ENV KAFKA_PORT=9092
# Ready once the client listener accepts connections (bash's /dev/tcp: no extra tools).
HEALTHCHECK --interval=2s --timeout=3s --start-period=120s --retries=3 \
  CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${KAFKA_PORT:-9092}"]
ENTRYPOINT ["/usr/local/bin/kafka-start"]
