# rvd's two set-up commands on a fresh Debian 12 machine:
#   make run    install missing packages (as root), build, start rvd on config/rvd.yaml
#   make test   the same set-up, then every test this machine can run
# `make build` only builds; `make bench` runs the CPU benchmark.

BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
CONFIG ?= config/rvd.yaml

# Everything rvd builds and tests with comes from Debian 12.
DEBIAN_PACKAGES := cmake g++ make pkg-config \
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc \
  prometheus-cpp-dev libabsl-dev libyaml-cpp-dev libspdlog-dev \
  libgtest-dev libgmock-dev libopenblas-dev liblapacke-dev nlohmann-json3-dev \
  libcurl4-openssl-dev libcivetweb-dev libcli11-dev prometheus \
  python3-grpcio python3-protobuf python3-numpy python3-pytest

.PHONY: deps build run test bench clean

deps:
	@missing=$$(for p in $(DEBIAN_PACKAGES); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; \
	  done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:" $$missing; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else \
	    echo "missing Debian packages (run as root, or: sudo apt-get install $$missing)"; exit 1; \
	  fi; \
	fi

build: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)
	cmake --build $(BUILD_DIR) -j $(JOBS)

run: build
	$(BUILD_DIR)/bin/rvd --config $(CONFIG)

# The GPU tests (label gpu) run on a GPU host: ctest --test-dir build -L gpu
test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -LE gpu

bench: build
	$(BUILD_DIR)/bin/rvd_bench_cpu

clean:
	rm -rf $(BUILD_DIR)
