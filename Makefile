# `make demo` and `make test` work on a fresh machine: each creates the environment if needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU build where one is on disk; override e.g. TORCH_SPEC='torch>=2.5' for another machine
TORCH_SPEC ?= torch==2.13.0
DEMO := demo-out

.PHONY: env test demo lint clean

env: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

test: env
	$(BIN)/python -m pytest -q

lint: env
	$(BIN)/ruff check lmconvert tests demo

demo: env
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	$(BIN)/python demo/tiny_checkpoint.py $(DEMO)/hf
	$(BIN)/lmconvert convert $(DEMO)/hf $(DEMO)/canonical
	$(BIN)/lmconvert verify $(DEMO)/canonical
	$(BIN)/lmconvert inspect $(DEMO)/canonical
	$(BIN)/lmconvert convert $(DEMO)/canonical $(DEMO)/hf-export --to hf
	$(BIN)/lmconvert generate $(DEMO)/canonical --prompt "The capital of France is" --max-new-tokens 16

clean:
	rm -rf $(VENV) $(DEMO)
