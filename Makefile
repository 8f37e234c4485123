# Everything runs in a private virtual environment, built on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck docs docs-check package bench soak faults fuzz gil-fetch replicas chaos-replicated bullmq-compat bullmq-latest clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

## demo: run the demo (starts its own server)
demo: $(STAMP)
	$(BIN)/python -m examples.demo

## test: lint, type-check, build the docs, run the whole suite, then the 45-second chaos run alone
test: lint typecheck docs
	$(BIN)/python -m pytest -n 2 --timeout 600
	$(BIN)/python -m pytest -m chaos -p no:randomly --timeout 600 tests/chaos

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy actors tests examples

## docs: build the documentation site into out/site (warnings are errors), check every internal link
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	$(BIN)/python docs/_tools/site_check.py links out/site

## docs-check: serve the built site, screenshot three pages in headless Chromium (apt-get install chromium)
docs-check: docs
	$(BIN)/python docs/_tools/site_check.py browse out/site out/docs-screenshots

## package: build the sdist and the wheel, twine check them, install each extra and each documented line in a fresh venv
package: $(STAMP)
	$(BIN)/python -m tests.packaging.check_dist

## bench: the performance benchmark (prints the Performance guide's tables)
bench: $(STAMP)
	$(BIN)/python -m pytest -m bench -s -p no:randomly tests/bench

## fuzz: the API fuzz (1000 examples; CI runs 150) and the bullmq schedules (25 per engine; CI runs 3)
fuzz: $(STAMP)
	FUZZ_EXAMPLES=1000 $(BIN)/python -m pytest -p no:randomly tests/fuzz
	BULLMQ_EXAMPLES=25 $(BIN)/python -m pytest -p no:randomly -rA tests/bullmq/test_generated.py

## replicas: the bullmq takes and their replicas' wait under flushes, a flapping or frozen replica, refusals
replicas: $(STAMP)
	$(BIN)/python -m pytest -m scenario -p no:randomly -rA --timeout 600 tests/replicas/test_takes.py

## gil-fetch: jobs fetched beside GIL holds in process mode, ten runs of 30 jobs (GIL holds of ~2x lockDuration)
gil-fetch: $(STAMP)
	GIL_RUNS=$${GIL_RUNS:-10} $(BIN)/python -m pytest -m scenario -p no:randomly -rA --timeout 600 tests/bullmq/test_gil_fetch.py

## bullmq-compat: bullmq-py's own tests, stock and with the integration (BULLMQ_TESTS=path/to/python/tests)
bullmq-compat: $(STAMP)
	$(BIN)/python -m tests.compat.run $(BULLMQ_TESTS)

## bullmq-latest: tests/bullmq against the newest bullmq-py the bullmq extra allows, in a throwaway venv
bullmq-latest:
	$(PYTHON) -m tests.compat.latest $(PYTEST_ARGS)

## faults: the fault suite and its results table
faults: $(STAMP)
	$(BIN)/python tests/faults/report.py

## chaos: four kinds of workers under a seeded nemesis, history checked (CHAOS_SECONDS=600, CHAOS_SEED)
chaos: $(STAMP)
	CHAOS_SECONDS=$${CHAOS_SECONDS:-600} $(BIN)/python -m tests.chaos.run

## chaos-replicated: the chaos run on a Sentinel-managed primary and replica, replicas=1 (CHAOS_SECONDS=300)
chaos-replicated: $(STAMP)
	CHAOS_REPLICATED=1 CHAOS_SECONDS=$${CHAOS_SECONDS:-300} $(BIN)/python -m tests.chaos.run

## soak: the full load run (100,000 jobs, about 2 minutes)
soak: $(STAMP)
	$(BIN)/python -m pytest -m soak -s tests/soak

clean:
	rm -rf $(VENV) build dist .mypy_cache .pytest_cache .ruff_cache
