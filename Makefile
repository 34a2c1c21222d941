# lmlab: two commands for a fresh machine.
#   make demo   create .venv, install, get the corpus, train the demo model on CPU, print held-out
#               bits-per-byte and a sample
#               (installs lmlab with the plot and tb extras only: what the demo and the README's tour
#               use; transformers, lm-eval and datasets come with make install / make test)
#   make test   create .venv, install with every extra, run ruff (lint, format check) and the test suite
#   make ablations  run every shipped spec from scratch (lmlab sweep, into a new sweeps/ablations-<time>
#               folder), write its report to docs/ablations/NAME/ and the index of all claims to
#               docs/ablations/README.md
#               (the sixteen pages' sweeps sum to 5.6 hours on 2 CPU cores, bf16 + compile: docs/lab.md;
#               first it runs `lmlab bench calibrate --if-missing`, about 3 minutes once per machine;
#               SPECS="01-norm-placement ..." for a subset, the index still covering every page in
#               docs/ablations; JOBS=1 for one run at a time; TIER=gpu DATA=DIR for the gpu tiers on a GPU)
PYTHON ?= python3
VENV   ?= .venv
# The torch wheel to install first; pinned so pip does not pick a multi-GB build when a local index
# offers one. Override, e.g. `make demo TORCH=torch`, to take whatever your index serves.
TORCH  ?= torch==2.13.0
RUN    ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)
RUN    := $(RUN)# evaluated once: each reference would otherwise call date again (a second may tick)
# make ablations: each invocation a new folder of sweeps, from scratch; SWEEPS=that folder resumes it
SWEEPS ?= sweeps/ablations-$(shell date +%Y%m%d-%H%M%S)
SWEEPS := $(SWEEPS)
BIN     = $(VENV)/bin

.PHONY: demo test install clean ablations
# two one-thread runs at once: 1.01-1.20x one two-thread run at a time (bench/sweep_batching.py)
JOBS   ?= 2
SPECS ?= $(basename $(notdir $(wildcard lmlab/specs/*.yaml)))
# TIER=gpu DATA=DIR: every spec's gpu tier (>= 20 tokens per parameter: DIR a prepared corpus of >= 1.2e9
# tokens, e.g. FineWeb-Edu; about 376 GPU-hours on one H200, docs/bench/gpu-tiers.md), pages NAME-gpu
TIER   ?=
DATA   ?=
SUFFIX    = $(if $(TIER),-$(TIER))
TIERFLAGS = $(if $(TIER),--tier $(TIER)) $(if $(DATA),--data $(DATA))

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# the demo's install: lmlab, torch and the extras the demo and the tour use (plots, TensorBoard)
$(VENV)/.installed-demo: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[plot,tb]"
	touch $@

# every extra: the tests, Hugging Face interop, lm-eval tasks, parquet/datasets corpora
$(VENV)/.installed: $(VENV)/.installed-demo
	$(BIN)/pip install --quiet -e ".[test,hf,plot,tb,eval,data,slurm,ray]"
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed-demo
	@test -n "$(strip $(RUN))" || { echo "make demo: RUN is empty; name the run folder, e.g. RUN=runs/demo1" >&2; exit 2; }
	@test -f data/shakespeare-bpe4096/manifest.json || $(BIN)/lmlab prepare
	$(BIN)/lmlab bench calibrate --if-missing --training-only
	@echo "demo run folder: $(RUN) (interrupted? \`make demo RUN=$(RUN)\` resumes it)"
	$(BIN)/lmlab train --config demo --out $(RUN)
	$(BIN)/lmlab eval $(RUN)
	$(BIN)/lmlab generate $(RUN) --prompt "HAMLET." --max-new-tokens 200 --temperature 0.8 --top-k 50 --seed 0

test: install
	$(BIN)/ruff check lmlab tests bench
	$(BIN)/ruff format --check lmlab tests bench
	$(BIN)/python -m pytest -q --durations=30

ablations: install
	@echo "sweeps folder: $(SWEEPS) (interrupted? \`make ablations SWEEPS=$(SWEEPS)\` resumes it)"
	$(BIN)/lmlab bench calibrate --if-missing
	@for s in $(SPECS); do \
	  $(BIN)/lmlab sweep $$s --out $(SWEEPS)/$$s$(SUFFIX) --jobs $(JOBS) $(TIERFLAGS) && \
	  $(BIN)/lmlab report $(SWEEPS)/$$s$(SUFFIX) --out docs/ablations/$$s$(SUFFIX)/report.md || exit 1; \
	done
	$(BIN)/lmlab report --index docs/ablations/[0-9]*/ --out docs/ablations/README.md --readme README.md --readme docs/lab.md

clean:
	rm -rf $(VENV) runs data
