# Two set-up commands: `make demo` runs the quickstart end to end; `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
OUT ?= results/quickstart
# The hw extra's torch: a CPU build is enough for the tests (CI has no GPU). On a GPU box,
# install the CUDA build you want first; `pip install -e ".[hw]"` then keeps it.
TORCH ?= torch==2.13.0

.PHONY: demo test docs lint bench clean load-tool

$(BIN)/dualpace-sim: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

$(VENV)/.hw: $(BIN)/dualpace-sim
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev,hw,serve,notebooks,docs,ray]"
	touch $@

# guidellm, the load tool benchmarks/serving/load.py drives `dualpace-hw serve` with, in a
# virtual environment of its own: it pins click and torch versions of its own.
LOAD_VENV := .venv-load
$(LOAD_VENV)/bin/guidellm:
	$(PYTHON) -m venv $(LOAD_VENV)
	$(LOAD_VENV)/bin/python -m pip install --quiet "$(TORCH)" "guidellm==0.8.1"

load-tool: $(LOAD_VENV)/bin/guidellm

demo: $(BIN)/dualpace-sim
	$(BIN)/dualpace-sim run scenarios/quickstart.yaml --out $(OUT)

test: $(VENV)/.hw $(LOAD_VENV)/bin/guidellm docs
	$(BIN)/ruff check dualpace_sim dualpace_hw tests benchmarks docs/gen
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest

# The documentation site into site/; --strict fails on any warning, such as a broken link or a
# command, option or schema key without help text (the reference pages are generated).
docs: $(VENV)/.hw
	$(BIN)/mkdocs build --strict

bench: $(BIN)/dualpace-sim
	$(BIN)/python -m benchmarks.sim_speed.run

clean:
	rm -rf $(VENV) $(LOAD_VENV) results site .pytest_cache .hypothesis
