# The front door of gradhub. `make setup` once on a fresh Debian 12 (as root, or with sudo),
# then `make test`.
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The user ranks run as (gradhub-agent --run-as; its default).
RANK_USER ?= gradhub-rank

# Every package gradhub needs to build, test and run on Debian 12.
PACKAGES := \
  build-essential cmake ninja-build ccache pkg-config git ca-certificates \
  protobuf-compiler libprotobuf-dev protobuf-compiler-grpc libgrpc++-dev libabsl-dev \
  libpq-dev postgresql postgresql-contrib \
  libtorch-dev libopenblas0-pthread libgloo-dev \
  prometheus-cpp-dev libcpp-httplib-dev libssl-dev openssl libisal-dev libyaml-cpp-dev nlohmann-json3-dev zlib1g-dev \
  libgtest-dev libgmock-dev googletest prometheus \
  python3-torch python3-sklearn python3-dev pybind11-dev python3-pytest python3-jsonschema clang-format \
  clang libclang-rt-14-dev nftables iproute2

.PHONY: setup build demo test bench fmt fmt-check clean compose-test chaos-test fuzz

# Idempotent: installs only what is missing, and touches the network only then; creates the
# ranks' user if it is missing.
setup:
	@missing=""; for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${db:Status-Status}' $$p 2>/dev/null | grep -qx installed || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "make setup: installing$$missing"; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $$missing; \
	else echo "make setup: all packages present"; fi
	@# The unprivileged user gradhub-agent starts ranks as (--run-as); never root.
	@if getent passwd $(RANK_USER) >/dev/null; then echo "make setup: user $(RANK_USER) present"; \
	else echo "make setup: creating system user $(RANK_USER)"; \
	  $(SUDO) useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
	    --user-group $(RANK_USER); fi

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

# Also makes this build's `gradhub` Python package (with its engine, gradhub._C) importable by
# /usr/bin/python3: a gradhub.pth in its first site directory names $(BUILD_DIR)/python.
# Without write access there (not root) it says so; PYTHONPATH=$(BUILD_DIR)/python then.
build: $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)
	@site=$$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])') && \
	if mkdir -p "$$site" 2>/dev/null && echo "$(abspath $(BUILD_DIR))/python" >"$$site/gradhub.pth" 2>/dev/null; \
	then echo "make build: /usr/bin/python3 imports gradhub from $(abspath $(BUILD_DIR))/python ($$site/gradhub.pth)"; \
	else echo "make build: $$site is not writable; use PYTHONPATH=$(abspath $(BUILD_DIR))/python"; fi

# The main job: `gradhub cluster up` (PostgreSQL, api, checkpoint, metrics, two agents with 2
# slots each, Prometheus), then the digits example submitted and watched with the gradhub CLI,
# its validation accuracy, checkpoints and metrics; the cluster goes down again unless
# KEEP_CLUSTER=1 (deploy/local/demo.sh).
demo: build
	deploy/local/demo.sh $(BUILD_DIR)

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

bench: build
	tests/bench/run.sh $(BUILD_DIR)

# docker-compose.yml for real (tests/e2e/compose/run.sh; root, a few minutes, not in `make
# test`): Debian's docker.io and docker-compose (installed if missing; dockerd started and
# stopped again), images built locally from build/bin, the topology up, a job submitted from
# the host through the published ports to SUCCEEDED with checkpoints and metrics, then down -v.
compose-test: build
	tests/e2e/compose/run.sh $(BUILD_DIR)

# The control plane's chaos at the issue's length (not in `make test`, which runs a short one;
# about 10 minutes): two api replicas, the leader SIGKILLed every 10 s for 2 minutes and
# SIGSTOPped for 20 s five times under training jobs (tests/e2e/cluster/leader_chaos_e2e_test.cc).
chaos-test: build
	GRADHUB_CHAOS_SECONDS=120 GRADHUB_CHAOS_PAUSES=5 GRADHUB_CHAOS_STEPS=150000 \
	  ctest --test-dir $(BUILD_DIR) --output-on-failure -R '^leader_chaos_e2e_test$$'

# The parsers' fuzz targets (tests/fuzz/) under libFuzzer, ASan and UBSan: a Clang build in
# $(FUZZ_DIR), then each target for FUZZ_RUNS executions on a scratch copy of its corpus (the
# tree's corpus is never written; libFuzzer's exit skips atexit, so a target's scratch files go
# to TMPDIR inside that copy). Prints executions and crashes per target; a crash's input
# lands in $(FUZZ_DIR)/artifacts/<target>/ and fails the run. FUZZ_FLAGS go to every target
# (libFuzzer's flags, e.g. -max_total_time=20: ctest fuzz_smoke, tests/fuzz/smoke.sh).
FUZZ_DIR ?= build-fuzz
FUZZ_RUNS ?= 1000000
FUZZ_FLAGS ?=
FUZZ_TARGETS := progress_record job_spec code_archive rest_request csv_dataset checkpoint_state
fuzz:
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DGRADHUB_FUZZ=ON -DGRADHUB_BUILD_TESTS=ON
	cmake --build $(FUZZ_DIR) -j $(JOBS) --target $(addsuffix _fuzz,$(FUZZ_TARGETS))
	@failed=0; for t in $(FUZZ_TARGETS); do \
	  work=$$(mktemp -d) && mkdir $$work/corpus $$work/tmp && cp -R tests/fuzz/corpus/$$t/. $$work/corpus/ && \
	  art=$(FUZZ_DIR)/artifacts/$$t && rm -rf $$art && mkdir -p $$art && \
	  log=$(FUZZ_DIR)/fuzz-$$t.log; \
	  TMPDIR=$$work/tmp $(FUZZ_DIR)/tests/$${t}_fuzz -runs=$(FUZZ_RUNS) -artifact_prefix=$$art/ \
	    $(FUZZ_FLAGS) $$work/corpus >$$log 2>&1; \
	  rc=$$?; rm -rf $$work; \
	  execs=$$(grep -oE '^(Done [0-9]+|#[0-9]+)' $$log | tail -1 | grep -oE '[0-9]+'); \
	  crashes=$$(ls $$art | wc -l); \
	  echo "make fuzz: $$t: $${execs:-0} executions, $$crashes crashes (exit $$rc, log $$log)"; \
	  [ $$rc = 0 ] && [ $$crashes = 0 ] || failed=1; \
	done; exit $$failed

# Every C++ file as .clang-format says; fmt-check (run by .ci/run) fails on any difference.
fmt:
	git ls-files '*.cc' '*.h' | xargs clang-format -i

fmt-check:
	git ls-files '*.cc' '*.h' | xargs clang-format --dry-run --Werror

clean:
	rm -rf $(BUILD_DIR)
