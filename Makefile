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

# Two at a time (pytest-xdist), a test file at a time per process (a file's shared campaign runs once), the
# longest files first (tests/helpers/scheduling.py; `--record-durations` rewrites tests/durations.json): the files
# that start Ray or train go first and the short ones fill the end, so neither process waits for the other. Each
# test judges only the processes it started (tests/conftest.py), and each Ray it starts has ports of its own.
# The project's modules are byte-compiled first: where PYTHONDONTWRITEBYTECODE is set, each of the hundreds of
# processes the suite starts (drivers, trials, Train workers) would compile them again.
# The documentation site is built first, strictly (a broken link or any warning fails), into build/docs-site/.
test: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet -f docs/mkdocs.yml
	$(BIN)/python -m compileall -q search spaces trainers
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=30

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
