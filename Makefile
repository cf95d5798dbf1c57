# transformerkit: `make demo` (train Multi30k de->en, print BLEU), `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export TRANSFORMERKIT_DATA ?= $(abspath ../shared/data)

.PHONY: install demo test test-slow bench lint clean

# every backend, hf and the test tools, at the exact versions of constraints.txt; torch first
# by itself (2.13.0 is the CPU build here: let pip pick no other torch)
EXTRAS ?= all,dev
CONSTRAINTS := constraints.txt

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "torch==2.13.0" -c $(CONSTRAINTS)
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]" -c $(CONSTRAINTS)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/transformerkit train configs/multi30k_de_en.yaml --out runs/demo-$$(date +%Y%m%d-%H%M%S)

# the numerics tests again with every PyTorch shortcut off (transformerkit/fastpath.py)
NUMERICS := tests/test_layers.py tests/test_masks.py tests/test_models.py \
	tests/test_decoding.py tests/test_decode_steps.py tests/test_training_math.py \
	tests/test_optimizers.py tests/test_fast_paths.py tests/test_gpt_options.py \
	tests/test_search_stopping.py

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n 2 -q
	TRANSFORMERKIT_FAST_PATHS=0 $(BIN)/python -m pytest -m "not slow" -n 2 -q $(NUMERICS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow -q

bench: $(STAMP)
	$(BIN)/python bench/train_step.py --batches 6 --repeats 1 --rounds 3

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

clean:
	rm -rf $(VENV) build *.egg-info
