# Every target creates .venv on first use, so a fresh clone needs only Python 3.11.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint bench bench-gpu clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/qkvsearch launch spaces/presets/quickstart.yaml --overwrite
	$(BIN)/qkvsearch report results/quickstart

# The tests that start no Ray and train for seconds run two at a time; those that start Ray (slow) one at a
# time, each with the machine's CPUs to itself.
test: $(STAMP)
	$(BIN)/python -m pytest -q -m 'not slow' -n 2
	$(BIN)/python -m pytest -q -m slow --durations=30

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m 'not slow'

lint: $(STAMP)
	$(BIN)/ruff check search spaces trainers tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_model.py
	$(BIN)/python benchmarks/bench_train.py
	$(BIN)/python benchmarks/bench_campaign.py
	$(BIN)/python benchmarks/bench_report.py
	$(BIN)/python benchmarks/bench_search.py

bench-gpu: $(STAMP)   # needs CUDA
	$(BIN)/python benchmarks/bench_gpu.py

clean:
	rm -rf $(VENV) build *.egg-info
