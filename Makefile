# The two commands of the README, and a few more for developers. Everything real happens in
# CMake (CMakeLists.txt); this file only chains: install dependencies -> configure -> build.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
# CI sets MOESIM_WERROR=ON so warnings fail the build.
MOESIM_WERROR ?= OFF

.PHONY: all deps configure build install pgo test test-all test-asan demo figures bench fuzz clean \
        docs

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESIM_WERROR=$(MOESIM_WERROR) $(CMAKE_ARGS)

configure: $(BUILD)/CMakeCache.txt

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

# The program, its data, docs, man page and bash completion under PREFIX (CMake's install rules;
# the installed tree needs neither the source nor the build tree). DESTDIR works as usual.
PREFIX ?= /usr/local
install: deps configure
	cmake --build $(BUILD) -j $(JOBS) --target moesim moesim_man
	cmake --install $(BUILD) --prefix $(PREFIX)

# A profile-guided build of the program in $(PGO_BUILD) (CMakeLists.txt, MOESIM_PGO; GCC): the
# simulator's modules built instrumented in $(PGO_BUILD)-train, trained (scripts/pgo-train.sh),
# then rebuilt with the profile. Its simulations take 1.5-14 % less CPU time, outputs unchanged
# (bench/README.md); `make install BUILD=$(PGO_BUILD)` installs it.
PGO_BUILD ?= build-pgo
PGO_DIR = $(abspath $(PGO_BUILD))/pgo-profile
pgo: deps
	rm -rf $(PGO_DIR)
	cmake -S . -B $(PGO_BUILD)-train -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESIM_CUDA=OFF \
	      -DMOESIM_BUILD_TESTS=OFF -DMOESIM_PGO=GENERATE -DMOESIM_PGO_DIR=$(PGO_DIR) \
	      -DMOESIM_WERROR=$(MOESIM_WERROR) $(CMAKE_ARGS)
	cmake --build $(PGO_BUILD)-train -j $(JOBS) --target moesim
	bash scripts/pgo-train.sh $(PGO_BUILD)-train/moesim
	cmake -S . -B $(PGO_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESIM_PGO=USE \
	      -DMOESIM_PGO_DIR=$(PGO_DIR) -DMOESIM_WERROR=$(MOESIM_WERROR) $(CMAKE_ARGS)
	cmake --build $(PGO_BUILD) -j $(JOBS) --target moesim

# The fast CPU suite, to run before every commit: all but the slow fits (label slow) and the
# timing checks (label timing). GPU tests (label gpu) report themselves skipped without a GPU.
test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) -LE 'slow|timing'

# The whole CPU suite, slow and timing checks included (CI runs it); they start first (COST).
test-all: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# Same suite under AddressSanitizer + UndefinedBehaviorSanitizer (CUDA off: host code only), but
# the timing checks (label timing: sanitizers change what they measure) and the slow fits (label
# slow: a sanitized fit takes a quarter of an hour and exercises the code the plain build does).
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DMOESIM_SANITIZE=ON -DMOESIM_CUDA=OFF \
	      -DMOESIM_WERROR=$(MOESIM_WERROR) $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	    ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) -LE 'timing|slow'

# The main job end to end: traces, simulations, figures in results/demo/. Builds only the program
# (no tests, benchmarks or CUDA kernels): in $(BUILD) when it is configured already (with
# whatever it was configured with), else in $(DEMO_BUILD) without CUDA (DEMO_CUDA=ON to ask).
DEMO_CUDA ?= OFF
DEMO_BUILD ?= $(if $(wildcard $(BUILD)/CMakeCache.txt),$(BUILD),build-demo)
demo: deps
	@[ -f $(DEMO_BUILD)/CMakeCache.txt ] || cmake -S . -B $(DEMO_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DMOESIM_CUDA=$(DEMO_CUDA) -DMOESIM_WERROR=$(MOESIM_WERROR) $(CMAKE_ARGS)
	cmake --build $(DEMO_BUILD) -j $(JOBS) --target moesim
	bash scripts/demo.sh $(DEMO_BUILD)/moesim results/demo

# The paper figures: every experiments/*.ini swept into results/ (resumable), then plots/NAME.gp.
figures: build
	@for e in experiments/*.ini; do \
	    n=$$(basename $$e .ini); \
	    $(BUILD)/moesim sweep $$e -j $(JOBS) && $(BUILD)/moesim plot $$n || exit 1; \
	done

# Every figure the docs quote, regenerated from the code (scripts/docs.sh).
docs: build
	bash scripts/docs.sh $(BUILD)/moesim

bench: build
	bash bench/run.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-demo $(PGO_BUILD) $(PGO_BUILD)-train

# Fuzz every parser of untrusted input (tests/fuzz/README.md) with libFuzzer (clang, ASan +
# UBSan), FUZZ_SECONDS per harness, one after the other; FUZZ_TARGETS picks some (e.g. "config"),
# FUZZ_RUNS=N stops a harness after N executions.
FUZZ_SECONDS ?= 300
FUZZ_TARGETS ?=
export FUZZ_RUNS
fuzz:
	bash scripts/install-deps.sh --fuzz
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DMOESIM_FUZZ=ON -DMOESIM_CUDA=OFF
	cmake --build build-fuzz -j $(JOBS) --target moesim_fuzzers moesim
	bash tests/fuzz/make_seeds.sh build-fuzz/moesim build-fuzz/fuzz-corpus
	bash tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)
