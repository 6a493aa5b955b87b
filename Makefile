# The two commands of the README.
#   make serve   builds Eddy (release) and starts it on 127.0.0.1:5433, data in ./data
#   make test    runs every test (see .ci/test)

CARGO_TARGET_DIR ?= $(HOME)/.cache/eddy-target
export CARGO_TARGET_DIR

.PHONY: serve test bench

serve:
	.ci/setup build
	cargo run --release -p eddy-server --bin eddy -- serve

test:
	.ci/test

# Every benchmark (bench/src/bin/suite.rs): reports in bench/results/. BENCH_ARGS=--quick
# runs them with tiny sizes. Then the concurrency sweep against PostgreSQL 15
# (bench/pgbench/sweep.sh; SWEEP_ARGS="SECONDS CLIENTS_LIST CARDS OUT_DIR", SWEEP_ROUNDS
# rounds per point, by default 3, compared by their medians), and the
# unavailability per fault kind (bench/nemesis.sh; NEMESIS_ARGS="RUNS SECONDS OUT_FILE"),
# and the end-to-end latency through Kafka beside the bare Kafka round trip
# (bench/kafka-latency.sh; KAFKA_LATENCY_ARGS, by default 5 k, 25 k and 50 k events/s, three
# alternated rounds each), and
# a Kafka-mode node's rate against the embedded log's for the same clients
# (bench/kafka-rate.sh; KAFKA_RATE_ARGS="SECONDS CLIENTS_LIST COPY_ROWS").
KAFKA_LATENCY_ARGS ?= --rates 5000,25000,50000 --seconds 20 --rounds 3
SWEEP_ROUNDS ?= 3
bench:
	storage/rocksdb/build-lib
	cargo run --release -p eddy-bench --bin suite -- $(BENCH_ARGS)
	ROUNDS=$(SWEEP_ROUNDS) bench/pgbench/sweep.sh $(SWEEP_ARGS)
	bench/nemesis.sh $(NEMESIS_ARGS)
	bench/kafka-latency.sh $(KAFKA_LATENCY_ARGS)
	bench/kafka-rate.sh $(KAFKA_RATE_ARGS)
