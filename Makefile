# transformerkit: `make demo` (train Multi30k de->en, print BLEU), `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export TRANSFORMERKIT_DATA ?= $(abspath ../shared/data)

.PHONY: install demo test test-slow test-kernels bench lint clean

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
NUMERICS := tests/layers/test_layers.py tests/layers/test_masks.py \
	tests/layers/test_decode_steps.py tests/layers/test_fast_paths.py \
	tests/models/test_models.py tests/models/test_gpt_options.py \
	tests/decoding/test_decoding.py tests/decoding/test_search_stopping.py \
	tests/decoding/test_no_repeat_ngrams.py \
	tests/training/test_training_math.py tests/training/test_optimizers.py

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n 2 -q
	TRANSFORMERKIT_FAST_PATHS=0 $(BIN)/python -m pytest -m "not slow" -n 2 -q $(NUMERICS)

# the numerics tests again on other CPU kernel families (tests/support/tolerances.py: each tolerance is
# a float32 rounding bound, so it must hold whatever blocking and summation order the kernels
# take): oneDNN, MKL and ATen capped at AVX2 with MKL's reproducible code path, then at
# AVX-512 where the CPU has it
KERNELS_AVX2 := MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2
KERNELS_AVX512 := MKL_CBWR=AVX512 ONEDNN_MAX_CPU_ISA=AVX512_CORE ATEN_CPU_CAPABILITY=avx512
# the tests of what is decided from the CPU's flags and vendor (auto, int8's input range, the
# float32 kernel), run again as each CPU family of tests/support/cpu_families.py that this CPU can
# run (TRANSFORMERKIT_CPU_FLAGS/_VENDOR change the decisions, not the kernels)
# the compiled step built under the AVX2 caps (Inductor's C++ vectorized for AVX2, oneDNN's
# AVX2 kernels) equals the eager step there too, and so does the encoder's package
COMPILED_EQUALS_EAGER := tests/decoding/test_compiled_step.py -k "steps_equal or searches_equal or encoder_pass"
CPU_DECISIONS := tests/decoding/test_precision.py tests/training/test_precision_auto.py \
	tests/layers/test_decode_steps.py tests/training/test_bfloat16_step.py
FAMILIES := $(BIN)/python tests/support/cpu_families.py

test-kernels: $(STAMP)
	$(KERNELS_AVX2) $(BIN)/python -m pytest -m "not slow" -n 2 -q $(NUMERICS)
	$(KERNELS_AVX2) $(BIN)/python -m pytest -q $(COMPILED_EQUALS_EAGER)
	if grep -qw avx512f /proc/cpuinfo; then \
		$(KERNELS_AVX512) $(BIN)/python -m pytest -m "not slow" -n 2 -q $(NUMERICS); \
	else echo "test-kernels: no AVX-512 on this CPU, its setting not run"; fi
	$(FAMILIES) --skipped | sed 's/^/test-kernels: CPU family not run: /'
	families=$$($(FAMILIES) --runnable) || exit 1; set -e; \
	echo "test-kernels: CPU families run here:" $$families; \
	for family in $$families; do \
		echo "test-kernels: as the CPU family $$family"; \
		env $$($(FAMILIES) --env $$family) \
			$(BIN)/python -m pytest -m "not slow" -n 2 -q $(CPU_DECISIONS); \
	done

# the slow tests two at a time, as the others: most of their time is one process compiling or
# waiting on its peers (17:57 against 22:36 minutes in one process on a 2-core Xeon)
test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow -n 2 -q
	$(MAKE) test-kernels

bench: $(STAMP)
	$(BIN)/python bench/train_step.py --batches 6 --repeats 1 --rounds 3
	$(BIN)/python bench/report.py

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

clean:
	rm -rf $(VENV) build *.egg-info
