# harness: `make help` lists the targets. Each target creates .venv with the pinned
# dependencies (requirements.txt) on first use.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV ?= .venv
PY ?= $(VENV)/bin/python
SWEEP ?=
REPORTS ?= reports
# The default study: GPipe vs 1F1B x pp 2,4 x M 2..16, emulated compute (conf/experiment/study.yaml).
SWEEP_ARGS ?= experiment=study

$(VENV)/.installed: requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@touch $@

.PHONY: help venv sweep report profile test test-fast bench clean
help: ## Show this help
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

venv: $(VENV)/.installed ## Create .venv and install the pinned dependencies

sweep: venv ## Run the default study on CPU (gloo, wandb offline), then its report (also as reports/example)
	$(PY) -m harness -m $(SWEEP_ARGS)
	$(PY) -m harness.report --out $(REPORTS) --copy-as example

report: venv ## Report the newest sweep under runs/ (or SWEEP=path) into reports/<sweep>/
	$(PY) -m harness.report $(SWEEP) --out $(REPORTS)

profile: venv ## Re-measure data/gpt_cpu_profile.json (the balance study's CPU profile)
	$(PY) -m harness.profile +scenario=cpu_real --microbatch-sizes 1 4 8 --out data/gpt_cpu_profile.json

test: venv ## Unit, multi-process (gloo) and end-to-end sweep tests
	$(PY) -m pytest -q -m "not bench"

test-fast: venv ## Pure unit tests only (seconds)
	$(PY) -m pytest -q -m "not dist and not sweep and not bench and not gpu"

bench: venv ## Benchmarks, timed; fails on a median 25% slower than benchmarks/baseline.json
	$(PY) -m pytest -q -m bench --benchmark-enable --benchmark-autosave \
		--benchmark-compare=benchmarks/baseline.json --benchmark-compare-fail=median:25% \
		--benchmark-columns=median,iqr,min,max,rounds --benchmark-sort=name

clean: ## Remove runs/ and caches (keeps .venv and reports/)
	rm -rf runs .pytest_cache .benchmarks
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
