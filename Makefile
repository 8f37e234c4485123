# Everything runs in a private virtual environment, built on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck bench soak faults fuzz clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

## demo: run the demo (starts its own server)
demo: $(STAMP)
	$(BIN)/python -m examples.demo

## test: lint, type-check and run the whole suite
test: lint typecheck
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy actors tests examples

## bench: the performance benchmark (prints the README's table)
bench: $(STAMP)
	$(BIN)/python -m pytest -m bench -s -p no:randomly tests/bench

## fuzz: the API fuzz at a longer profile (1000 examples; CI runs 150)
fuzz: $(STAMP)
	FUZZ_EXAMPLES=1000 $(BIN)/python -m pytest -p no:randomly tests/fuzz

## faults: the fault suite and its results table
faults: $(STAMP)
	$(BIN)/python tests/faults/report.py

## soak: the full load run (100,000 jobs, about 2 minutes)
soak: $(STAMP)
	$(BIN)/python -m pytest -m soak -s tests/soak

clean:
	rm -rf $(VENV) build dist .mypy_cache .pytest_cache .ruff_cache
