# rvd's two set-up commands on a fresh Debian 12 machine:
#   make run    install missing packages (as root), build, start rvd on config/rvd.yaml
#   make test   the same set-up, then every test this machine can run: the
#               tests (warnings are errors), the same tests under ASan+UBSan
#               (make asan), the concurrent parts under TSan (make tsan), each
#               fuzz target for TEST_FUZZ_SECONDS (make fuzz)
# `make build` only builds; `make bench` runs the CPU benchmark; `make asan`
# runs the tests under ASan+UBSan; `make fuzz` runs each fuzz target.

BUILD_DIR ?= build
ASAN_BUILD_DIR ?= build-asan
FUZZ_BUILD_DIR ?= build-fuzz
TSAN_BUILD_DIR ?= build-tsan
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
CONFIG ?= config/rvd.yaml
# Extra CMake arguments for BUILD_DIR, e.g. -DRVD_WERROR=ON.
CMAKE_ARGS ?=
# Seconds each fuzz target runs.
FUZZ_SECONDS ?= 60
TEST_FUZZ_SECONDS ?= 30

# Everything rvd builds and tests with comes from Debian 12 (clang and
# libclang-rt-14-dev: the fuzz targets; g++'s own libasan/libubsan: make asan).
DEBIAN_PACKAGES := cmake g++ make pkg-config \
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc \
  prometheus-cpp-dev libabsl-dev libyaml-cpp-dev libspdlog-dev \
  libgtest-dev libgmock-dev libopenblas-dev liblapacke-dev nlohmann-json3-dev \
  libcurl4-openssl-dev libcivetweb-dev libcli11-dev prometheus \
  python3-grpcio python3-protobuf python3-numpy python3-pytest python3-yaml \
  python3-torch python3-venv \
  clang libclang-rt-14-dev libsqlite3-dev \
  libssl-dev openssl

.PHONY: deps build run test asan tsan fuzz bench clean

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
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)
	cmake --build $(BUILD_DIR) -j $(JOBS)

run: build
	$(BUILD_DIR)/bin/rvd --config $(CONFIG)

# The GPU tests (label gpu) run on a GPU host: ctest --test-dir build -L gpu
test: CMAKE_ARGS += -DRVD_WERROR=ON
test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -LE gpu
	$(MAKE) --no-print-directory asan
	$(MAKE) --no-print-directory tsan
	$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(TEST_FUZZ_SECONDS)

# The unit and integration tests built with AddressSanitizer and
# UndefinedBehaviorSanitizer (CPU only; reports fail the run: see
# tests/sanitizers/run_tests.sh).
asan: deps
	cmake -S . -B $(ASAN_BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DRVD_CUDA=OFF -DRVD_SANITIZE=address,undefined
	cmake --build $(ASAN_BUILD_DIR) -j $(JOBS)
	tests/sanitizers/run_tests.sh $(ASAN_BUILD_DIR)

# The concurrency tests (measurement log, index, event bus, history) under
# ThreadSanitizer: only those targets and what they link (rvd::history,
# absl), CPU only. Any report fails the run. Debian's absl::Mutex is made
# visible to TSan by tests/tsan/absl_mutex_annotations.cc (see there).
TSAN_TESTS := sqlite_store_test measurement_log_test measurement_index_test event_bus_test history_test \
              alerts_test
tsan: deps
	cmake -S . -B $(TSAN_BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DRVD_CUDA=OFF -DRVD_SANITIZE=thread
	cmake --build $(TSAN_BUILD_DIR) -j $(JOBS) --target $(TSAN_TESTS)
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	  ctest --test-dir $(TSAN_BUILD_DIR) --output-on-failure \
	  -R '^(sqlite_store|measurement_log|measurement_index|event_bus|history|alerts)_test$$'

# The libFuzzer targets (clang; tests/fuzz), each run FUZZ_SECONDS on its corpus.
fuzz: deps
	cmake -S . -B $(FUZZ_BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DRVD_CUDA=OFF \
	  -DRVD_FUZZ=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
	cmake --build $(FUZZ_BUILD_DIR) -j $(JOBS) --target rvd_fuzzers
	tests/fuzz/run_fuzzers.sh $(FUZZ_BUILD_DIR) $(FUZZ_SECONDS)

bench: build
	$(BUILD_DIR)/bin/rvd_bench_cpu

clean:
	rm -rf $(BUILD_DIR) $(ASAN_BUILD_DIR) $(FUZZ_BUILD_DIR) $(TSAN_BUILD_DIR)
