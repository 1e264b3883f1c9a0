# Two set-up commands: `make demo` runs the quickstart end to end; `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
OUT ?= results/quickstart

.PHONY: demo test lint bench clean

$(BIN)/dualpace-sim: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

demo: $(BIN)/dualpace-sim
	$(BIN)/dualpace-sim run scenarios/quickstart.yaml --out $(OUT)

test: $(BIN)/dualpace-sim
	$(BIN)/ruff check dualpace_sim dualpace_hw tests benchmarks
	$(BIN)/python -m pytest

bench: $(BIN)/dualpace-sim
	$(BIN)/python benchmarks/sim_speed.py

clean:
	rm -rf $(VENV) results .pytest_cache .hypothesis
