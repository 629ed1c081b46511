# Two entry points for a fresh machine: `make demo` and `make test` (each builds .venv as needed).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test,cuda-compile]"
	touch $@

demo: $(BIN)/.installed
	$(BIN)/python -m autosched.demo

test: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/python -m pytest tests

lint: $(BIN)/.installed
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build
