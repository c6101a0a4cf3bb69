# packtool: `make demo` packs the shipped demo data; `make test` runs the tests. Both install first.
PYTHON ?= python3
VENV ?= .venv
# On this platform torch==2.13.0 is a CPU wheel on local disk; any other spec downloads gigabytes.
TORCH_SPEC ?= torch==2.13.0
NEMO_WHEEL_SPEC ?= nemo-automodel==0.1.2
NEMO07_WHEEL_SPEC ?= nemo-automodel==0.7.0
TRL_WHEEL_SPEC ?= trl==1.16.0
BIN := $(VENV)/bin
DEMO_STAMP := $(VENV)/.packtool-demo-installed
STAMP := $(VENV)/.packtool-installed

.PHONY: install install-demo demo test test-all fuzz lint bench bench-scale clean

# The demo needs torch and packtool's core dependencies only.
install-demo: $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e .
	touch $(DEMO_STAMP)

# Tests add the dev extras (ray, energon, transformers, pytest, ...) and NeMo's wheels (0.1.2, 0.7.0).
install: $(STAMP)

$(STAMP): $(DEMO_STAMP)
	$(BIN)/python -m pip install -q -e ".[dev]"
	# reference implementation for parity tests: only its wheel file, never imported as a dependency
	mkdir -p .cache/wheels
	$(BIN)/python -m pip download -q --no-deps -d .cache/wheels "$(NEMO_WHEEL_SPEC)"
	$(BIN)/python -m pip download -q --no-deps -d .cache/wheels "$(NEMO07_WHEEL_SPEC)"
	$(BIN)/python -m pip download -q --no-deps -d .cache/wheels "$(TRL_WHEEL_SPEC)"
	touch $(STAMP)

demo: install-demo
	$(BIN)/packtool pack --config configs/demo.yaml --overwrite
	$(BIN)/packtool inspect out/demo

# under 6 minutes on 2 cores (3 processes: a third runs while the others wait on their subprocesses); the
# tests marked slow (more combinations of covered tests, tests/conftest.py's SLOW) run in test-all
test: install
	$(BIN)/python -m pytest -q -n 3 -m "not slow"

test-all: install
	$(BIN)/python -m pytest -q -n 2

# the readers of an output fuzzed for longer than `make test` does (tests/unit/test_fuzz_readers.py)
fuzz: install
	PACKTOOL_FUZZ_EXAMPLES=2000 $(BIN)/python -m pytest -q -n 0 tests/unit/test_fuzz_readers.py

lint: install
	$(BIN)/ruff check src tests scripts examples configs

bench: install
	$(BIN)/python scripts/bench_pack.py
	$(BIN)/python scripts/bench_loader.py
	$(BIN)/python scripts/bench_columns.py
	$(BIN)/python scripts/bench_memory.py
	$(BIN)/python scripts/bench_engines.py
	$(BIN)/python scripts/bench_tar_compression.py
	$(BIN)/python scripts/bench_startup.py
	$(BIN)/python scripts/bench_vision.py
	$(BIN)/python scripts/bench_storage.py

# 100M, 300M and 1B tokens (about 3 minutes of packing, 15 GiB of disk at the peak): docs/performance.md
bench-scale: install
	$(BIN)/python scripts/bench_scale.py

clean:
	rm -rf out .cache .pytest_cache
