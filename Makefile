# lmlab: two commands for a fresh machine.
#   make demo   create .venv, install, get the corpus, train the demo model on CPU, print held-out
#               bits-per-byte and a sample
#   make test   create .venv, install with the test extras, run the test suite
PYTHON ?= python3
VENV   ?= .venv
# The torch wheel to install first; pinned so pip does not pick a multi-GB build when a local index
# offers one. Override, e.g. `make demo TORCH=torch`, to take whatever your index serves.
TORCH  ?= torch==2.13.0
RUN    ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)
BIN     = $(VENV)/bin

.PHONY: demo test install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[test,hf,plot]"
	touch $@

install: $(VENV)/.installed

demo: install
	@test -f data/shakespeare-bpe4096/manifest.json || $(BIN)/lmlab prepare
	$(BIN)/lmlab train --config demo --out $(RUN)
	$(BIN)/lmlab eval $(RUN)
	$(BIN)/lmlab generate $(RUN) --prompt "HAMLET." --max-new-tokens 200 --temperature 0.8 --top-k 50 --seed 0

test: install
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs data
