# lmlab: two commands for a fresh machine.
#   make demo   create .venv, install, get the corpus, train the demo model on CPU, print held-out
#               bits-per-byte and a sample
#   make test   create .venv, install with the test extras, run the test suite
#   make ablations  run every shipped spec (lmlab sweep), write its report to docs/ablations/NAME/ and
#               the index of all claims to docs/ablations/README.md
#               (about 3.9 hours on 2 CPU cores, from the executions in docs/ablations; SPECS="01-norm-placement ..."
#               for a subset; JOBS=1 for one run at a time)
PYTHON ?= python3
VENV   ?= .venv
# The torch wheel to install first; pinned so pip does not pick a multi-GB build when a local index
# offers one. Override, e.g. `make demo TORCH=torch`, to take whatever your index serves.
TORCH  ?= torch==2.13.0
RUN    ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)
BIN     = $(VENV)/bin

.PHONY: demo test install clean ablations
# two one-thread runs at once: 1.01-1.20x one two-thread run at a time (bench/sweep_batching.py)
JOBS   ?= 2
SPECS ?= $(basename $(notdir $(wildcard lmlab/specs/*.yaml)))

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[test,hf,plot,tb,eval,data]"
	touch $@

install: $(VENV)/.installed

demo: install
	@test -f data/shakespeare-bpe4096/manifest.json || $(BIN)/lmlab prepare
	@echo "demo run folder: $(RUN) (interrupted? \`make demo RUN=$(RUN)\` resumes it)"
	$(BIN)/lmlab train --config demo --out $(RUN)
	$(BIN)/lmlab eval $(RUN)
	$(BIN)/lmlab generate $(RUN) --prompt "HAMLET." --max-new-tokens 200 --temperature 0.8 --top-k 50 --seed 0

test: install
	$(BIN)/python -m pytest -q

ablations: install
	@for s in $(SPECS); do \
	  $(BIN)/lmlab sweep $$s --out sweeps/$$s --jobs $(JOBS) && \
	  $(BIN)/lmlab report sweeps/$$s --out docs/ablations/$$s/report.md || exit 1; \
	done
	$(BIN)/lmlab report --index $(addprefix docs/ablations/,$(SPECS)) --out docs/ablations/README.md --readme README.md

clean:
	rm -rf $(VENV) runs data
