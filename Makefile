# harness: `make help` lists the targets. Each target creates .venv with the pinned
# dependencies (requirements.txt) on first use.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV ?= .venv
PY ?= $(VENV)/bin/python
SWEEP ?=
REPORTS ?= reports
# make dashboard: the W&B project (wandb.project) and entity (empty: your default one)
PROJECT ?= harness
ENTITY ?=
DASHBOARD_ARGS ?=
# The default study: GPipe vs 1F1B x pp 2,4 x M 2..16, emulated compute (harness/conf/experiment/study.yaml),
# then microbatch size x checkpointing (real compute), dp 1,2,4, two partitioners and tp 1,2 at 4 ranks, all in one
# sweep dir.
SWEEP_ARGS ?= experiment=study
SWEEP_DIR := runs/sweeps/$(shell date +%Y-%m-%d_%H-%M-%S)
# job directories of the later parts get a prefix (ckpt0_..., dp1_...): ids stay unique in the report
# (quoted: Hydra's override grammar parses a nested interpolation only inside a quoted string)
SUBDIR = 'hydra.sweep.subdir="$(1)$${hydra.job.num}_$${harness.dirname:$${hydra.job.override_dirname}}"'
# each part of the sweep writes <sweep>/multirun.yaml (its -m invocation's config): kept as multirun.<part>.yaml
KEEP_MULTIRUN = mv $(SWEEP_DIR)/multirun.yaml $(SWEEP_DIR)/multirun.$(1).yaml
# make profile: where the CPU profile goes (git-ignored runs/; OUT=data/gpt_cpu_profile.json refreshes the committed one)
OUT ?= runs/profile/gpt_cpu_profile.json
# make advise: the README's worked example (a one-block profile expanded to the model's 82 layers). The
# derived profile is the fallback: ADVISE_PROFILE=data/llama70b_h200_block_profile.json (make gpu-check
# measures it on an H200) re-prices the example on measured times.
# tp > 1 is priced on a TP rank's profile (ADVISE_TP_PROFILES: python -m harness.advise.derive --tp N
# --sequence-parallel); ADVISE_SPACE narrows the space (e.g. --pp 8 --microbatch-sizes 1 --virtual-stages 2);
# empty: every pp, B and v (a tp > 1 stage's memory composed from its layers' traces: a few minutes on 2 cores)
ADVISE_PROFILE ?= data/llama70b_h200_derived_block_profile.json
ADVISE_TP_PROFILES ?= $(foreach t,2 4 8,data/llama70b_h200_derived_block_profile_tp$(t).json)
ADVISE_SPACE ?=
ADVISE_ARGS ?= cluster=h200_8nodes profile=$(ADVISE_PROFILE) dtype=bf16 optimizer=adamw --global-batch 512 \
	--tp-profiles $(ADVISE_TP_PROFILES) $(ADVISE_SPACE)
# pytest -m: make test runs all but `slow`; make test-fast only pure unit tests; make test-all everything
FAST := not (dist or sweep or bench or gpu or grid or subprocess or slow)
PYTEST_ARGS ?=

# requirements-test.txt: test-only extras (torchtitan's config parser for tests/test_export.py), --no-deps so
# that no pin of requirements.txt (torch) moves; requirements-megatron.txt: Megatron-LM's parser, unpacked
# beside the venv (see that file)
$(VENV)/.installed: requirements.txt requirements-test.txt requirements-megatron.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -r requirements-test.txt
	$(PY) -m pip install -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
		--target $(VENV)/megatron --upgrade -r requirements-megatron.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@touch $@

.PHONY: help venv sweep example report profile advise advise-validate sc21 llama3 calibrate test test-fast test-all bench gpu-check \
	gpu-wheels clean dashboard
help: ## Show this help
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

venv: $(VENV)/.installed ## Create .venv and install the pinned dependencies

sweep: venv ## The default study on CPU (gloo, wandb offline), every axis lightly, into runs/sweeps/<time>/; its report into reports/<time>/
	$(PY) -m harness -m $(SWEEP_ARGS) hydra.sweep.dir=$(SWEEP_DIR)
	$(call KEEP_MULTIRUN,study)
	$(PY) -m harness -m pp=2 microbatches=8 microbatch_size=4,8 checkpointing=false,true compute=real steps=3 \
		hydra.sweep.dir=$(SWEEP_DIR) $(call SUBDIR,ckpt)
	$(call KEEP_MULTIRUN,ckpt)
	$(PY) -m harness -m experiment=dp schedule=1f1b hydra.sweep.dir=$(SWEEP_DIR) $(call SUBDIR,dp)
	$(call KEEP_MULTIRUN,dp)
	$(PY) -m harness -m experiment=balance +scenario=h200_emulated partition=params,profile \
		hydra.sweep.dir=$(SWEEP_DIR) $(call SUBDIR,part)
	$(call KEEP_MULTIRUN,part)
	$(PY) -m harness -m experiment=tp hydra.sweep.dir=$(SWEEP_DIR) $(call SUBDIR,tp)
	$(call KEEP_MULTIRUN,tp)
	$(PY) -m harness -m experiment=tp tp=1 dp=2 sequence_parallel=false hydra.sweep.dir=$(SWEEP_DIR) $(call SUBDIR,tpref)
	$(call KEEP_MULTIRUN,tpref)
	$(PY) -m harness.report $(SWEEP_DIR) --out $(REPORTS)

# make example: a fresh make sweep, unless SWEEP names one already run
ifeq ($(SWEEP),)
example: sweep
endif
example: venv ## Regenerate the committed reports/example/ (the README's figures): make sweep's report, or SWEEP=path's
	$(PY) -m harness.report $(or $(SWEEP),$(SWEEP_DIR)) --out $(REPORTS) --copy-as example

report: venv ## Report the newest sweep under runs/ (or SWEEP=path) into reports/<sweep>/
	$(PY) -m harness.report $(SWEEP) --out $(REPORTS)

profile: venv ## Measure the balance study's CPU profile into OUT (runs/profile/; OUT=data/gpt_cpu_profile.json refreshes it)
	@mkdir -p $(dir $(OUT))
	$(PY) -m harness.profile +scenario=cpu_real --microbatch-sizes 1 4 8 --out $(OUT)

test: venv ## Unit, grids, multi-process (gloo), in-process sweeps and reports: all but `slow` (2.7 min on the quiet 2-core VM of 2026-12-04; tests/README.md)
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-fast: venv ## Pure unit tests only (seconds): no processes, grids, sweeps or benchmarks
	$(PY) -m pytest -q -m "$(FAST)" $(PYTEST_ARGS)

test-all: venv ## Everything make test runs, and `slow`: long sweeps, subprocess twins, every benchmark once untimed (~20 min)
	HARNESS_BENCH=1 $(PY) -m pytest -q $(PYTEST_ARGS)

# make bench: the timed run into .benchmarks/last.json, then benchmarks/judge.py's verdict on it
BENCH_JSON ?= .benchmarks/last.json
bench: venv ## Benchmarks, timed: fails on a goal not met, or on a median 25% slower than a baseline saved on this machine
	@mkdir -p $(dir $(BENCH_JSON))
	$(PY) -m pytest -q -m bench --benchmark-enable --benchmark-autosave --benchmark-json=$(BENCH_JSON) \
		--benchmark-columns=median,iqr,min,max,rounds --benchmark-sort=name $(PYTEST_ARGS); \
		status=$$?; $(PY) -m benchmarks.judge $(BENCH_JSON) --baseline benchmarks/baseline.json || status=1; exit $$status

advise: venv ## Predict the best pipeline for a model on a cluster (ADVISE_ARGS; default the README's 70B Llama on 8 x 8 H200)
	$(PY) -m harness.advise $(ADVISE_ARGS)

advise-validate: venv ## Predicted against measured on this machine (cluster=here): reports/advise_validation/
	$(PY) -m tools.advise_validate --out reports/advise_validation

sc21: venv ## SC21 Megatron-LM Table 1 (GPT 39B-1T on DGX A100) through executor=sim, beside the published TFLOP/s
	$(PY) -m tools.sc21

llama3: venv ## Llama 3 405B's pre-training on 8,192 and 16,384 H100s (arXiv:2407.21783 Table 4) through executor=sim, beside the published TFLOP/s
	$(PY) -m tools.llama3

calibrate: venv ## Measure this machine as cluster=here (harness/conf/cluster/here.yaml); on a quiet machine
	$(PY) -m tools.calibrate

gpu-check: ## On a CUDA machine: every GPU test and figure, one script (PY=python3 where there is no .venv)
	PY=$(if $(wildcard $(PY)),$(PY),python3) tools/gpu_check.sh

gpu-wheels: ## Wheels gpu-check needs on a machine without hydra-core/omegaconf (into .whl/, Python 3.12)
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
		hydra-core==1.3.8 omegaconf==2.3.1 PyYAML==6.0.4
	$(PYTHON) -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # pure Python, sdist only

dashboard: venv ## The README's W&B panels as code for PROJECT (dry run; DASHBOARD_ARGS=--save sends them)
	$(PY) -m harness.records.dashboard --project $(PROJECT) $(if $(ENTITY),--entity $(ENTITY)) $(DASHBOARD_ARGS)

clean: ## Remove what runs and tests made: runs/ (wandb's files too), ./wandb, caches (keeps .venv and reports/)
	rm -rf runs wandb .pytest_cache .benchmarks
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
