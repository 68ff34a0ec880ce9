# hybridplan — the README's two commands are `make demo` and `make test`; both work from a fresh
# clone on a fresh Debian 12 machine (scripts/install-deps.sh installs what is missing).
PYTHON    ?= python3
JOBS      ?= $(shell nproc)
BUILD     := build
CORE      := build-core
TORCH_CMAKE = $(shell $(PYTHON) -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
export PYTHONPATH := $(CURDIR)/python$(if $(PYTHONPATH),:$(PYTHONPATH))
export HYBRIDPLAN_CLI := $(CURDIR)/$(BUILD)/bin/hybridplan
# Every CMake configure below (build-core, build, the consumer, the wheel pip builds) compiles
# through ccache (scripts/install-deps.sh installs it): the torch-free core is compiled in three
# of them with the same flags. Deferred (=): on a fresh machine ccache exists only after `deps`.
export CMAKE_CXX_COMPILER_LAUNCHER = $(shell command -v ccache)
# One compiler name for all of them (yours if you set CXX, else make's g++): ccache keys on it,
# and the wheel's CMake (from PyPI) picks g++ where Debian's picks c++.
export CXX

.PHONY: all deps build core test test-core test-torch test-python test-full test-install test-asan fuzz demo bench paper megatron tta clean

all: build

deps: $(BUILD)/.deps-stamp
$(BUILD)/.deps-stamp: scripts/install-deps.sh
	@bash scripts/install-deps.sh
	@mkdir -p $(BUILD) && touch $@

# Torch-free core, CLI and planner tests, configured without LibTorch: proves the boundary.
core: deps
	@[ -f $(CORE)/build.ninja ] || cmake -S . -B $(CORE) -G Ninja -DHYBRIDPLAN_WITH_TORCH=OFF \
	  -DHYBRIDPLAN_BUILD_PYTHON=OFF >/dev/null
	@cmake --build $(CORE) -j $(JOBS)

# Everything: core, CLI (build/bin/hybridplan), hybridplan._C, LibTorch profiler/executor.
build: deps
	@[ -f $(BUILD)/build.ninja ] || cmake -S . -B $(BUILD) -G Ninja -DHYBRIDPLAN_WITH_TORCH=ON \
	  -DCMAKE_PREFIX_PATH="$(TORCH_CMAKE)" -DPython3_EXECUTABLE=$$(command -v $(PYTHON)) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test-core: core
	cd $(CORE) && ctest --output-on-failure

test-torch: build
	cd $(BUILD) && ctest --output-on-failure

# The long matrices' full form (every model under every plan kind, 4-rank variants; pytest marker
# `full`, tests/python/conftest.py) runs in `make test-full`, which `make bench` runs too;
# `make test` runs their reduced form. --durations: the slowest tests, printed by every run, are
# what `make test`'s 30-minute budget is kept by.
test-python: build
	$(PYTHON) -m pytest -q tests/python -m "not full" --durations=25

test-full: build
	$(PYTHON) -m pytest -q tests/python -m full

test: test-core test-torch test-python test-install

# ---- installing: what a C++ user and a pip user get ------------------------------------------
# `cmake --install` of the built tree into build/install-test, then tests/consumer (its own
# CMakeLists.txt, find_package(hybridplan)) built against it and run; then `pip install .` into a
# fresh venv without torch (tests/install/test_pip_install.sh; its build folder build-wheel/ is
# kept, so a second run recompiles nothing).
INSTALL_TEST := $(BUILD)/install-test
test-install: build
	@rm -rf $(INSTALL_TEST) && cmake --install $(BUILD) --prefix $(INSTALL_TEST) >/dev/null
	@cmake -S tests/consumer -B $(BUILD)/consumer -G Ninja -DWITH_TORCH=ON \
	  -DCMAKE_PREFIX_PATH="$(CURDIR)/$(INSTALL_TEST);$(TORCH_CMAKE)" >/dev/null
	@cmake --build $(BUILD)/consumer -j $(JOBS)
	$(BUILD)/consumer/plan_consumer examples/graph-tiny.json dgx1-v100 8
	$(BUILD)/consumer/torch_consumer
	bash tests/install/test_pip_install.sh $(PYTHON)

# ---- reliability: sanitizers and fuzzing of everything the planner reads ------------------
# AddressSanitizer + UndefinedBehaviorSanitizer build of the torch-free core, the CLI and the
# planner tests (build-asan/, no LibTorch, no Python module), then ctest: any report fails it.
ASAN := build-asan
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
test-asan: deps
	@[ -f $(ASAN)/build.ninja ] || cmake -S . -B $(ASAN) -G Ninja -DHYBRIDPLAN_SANITIZE=ON \
	  -DHYBRIDPLAN_WITH_TORCH=OFF -DHYBRIDPLAN_BUILD_PYTHON=OFF >/dev/null
	@cmake --build $(ASAN) -j $(JOBS) --target planner_tests hybridplan
	cd $(ASAN) && $(ASAN_ENV) ctest --output-on-failure

# libFuzzer (clang) targets for the Graph/Cluster/Job/Plan loaders and the PipeDream importer,
# FUZZ_SECONDS each (default 60), seeded from examples/, presets/, reproductions/, tests/data and tests/fuzz/seeds.
# Not part of `make test` (it needs clang); HYBRIDPLAN_FUZZ_DEPS=1 makes install-deps add clang.
FUZZ := build-fuzz
FUZZ_SECONDS ?= 60
fuzz:
	@HYBRIDPLAN_FUZZ_DEPS=1 bash scripts/install-deps.sh
	FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) bash scripts/fuzz.sh

demo: build
	$(PYTHON) examples/demo.py

bench: build
	$(PYTHON) bench/run_all.py

paper: build
	$(PYTHON) reproductions/pal2019/reproduce.py

# Narayanan et al. 2021 (Megatron-LM, arXiv 2104.04473): Table 1, Figures 13 and 10 planned and
# priced from each model's config (reproductions/megatron2021/results/).
megatron: build
	$(PYTHON) reproductions/megatron2021/reproduce.py --no-sensitivity
	$(PYTHON) reproductions/megatron2021/reproduce.py --rows 1.7B 7.5B 18.4B 39.1B --no-figures \
	  --out reproductions/megatron2021/results/sensitivity-subset

# Time to accuracy on this machine: the batch-size trade-off trained to a target on real data,
# and plans trained to it with torchrun, predicted against measured (out/time_to_accuracy/).
tta: build
	$(PYTHON) examples/time_to_accuracy.py $(TTA_ARGS)

clean:
	rm -rf $(BUILD) $(CORE) $(ASAN) $(FUZZ) build-wheel
