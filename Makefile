# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv and install
# everything they need into it (pinned by constraints.txt), offline-safe and key-free.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --disable-pip-version-check -q -c constraints.txt

# Telemetry off, model hubs off: everything runs on what the packages ship.
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := true
export RAGAS_DO_NOT_TRACK := true
export DEEPEVAL_TELEMETRY_OPT_OUT := 1
export DEEPEVAL_FILE_SYSTEM := READ_ONLY
export DEEPEVAL_DISABLE_DOTENV := 1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test install install-dev bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q --upgrade pip

$(VENV)/.installed: $(PY) pyproject.toml constraints.txt
	$(PIP) -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) -e '.[dev]'
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: install
	$(PY) examples/quickstart.py

test: install-dev
	$(PY) -m pytest

bench: install-dev
	$(PY) bench/retrieval.py

clean:
	rm -rf $(VENV) mlruns mlflow.db .pytest_cache
