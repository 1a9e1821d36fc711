# dit-quantize: `make demo` runs the tool end to end on a built-in example, `make test` runs the tests.
# Both set everything up on a fresh machine. torch is pinned to the 2.13.0 CPU wheel: an unpinned
# torch would pull a multi-GB CUDA build.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION := 2.13.0
DEMO := demo-data

# torch's floor (pyproject's range starts there): PyPI's 2.11.0 is a CUDA wheel that runs on the CPU
FLOOR_TORCH := 2.11.0
FLOOR := .venv-floor

.PHONY: setup demo test test-floor bench bench-large bench-peers gpu-check docs lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check "torch==$(TORCH_VERSION)"
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $@

demo: setup
	rm -rf $(DEMO)
	$(BIN)/quantize example $(DEMO)/Wan2.1-T2V-small --preset small --layout t2v --lora $(DEMO)/style-lora.safetensors
	$(BIN)/quantize recipes --for $(DEMO)/Wan2.1-T2V-small
	$(BIN)/quantize plan $(DEMO)/Wan2.1-T2V-small --format fp8_channel
	$(BIN)/quantize convert $(DEMO)/Wan2.1-T2V-small $(DEMO)/Wan2.1-T2V-small-fp8 --format fp8_channel
	$(BIN)/quantize verify $(DEMO)/Wan2.1-T2V-small-fp8 --source $(DEMO)/Wan2.1-T2V-small
	$(BIN)/quantize inspect $(DEMO)/Wan2.1-T2V-small-fp8
	$(BIN)/quantize convert $(DEMO)/Wan2.1-T2V-small $(DEMO)/Wan2.1-T2V-small-comfy-fp8 --recipe wan-comfy-fp8.yaml
	$(BIN)/quantize verify $(DEMO)/Wan2.1-T2V-small-comfy-fp8 --source $(DEMO)/Wan2.1-T2V-small
	$(BIN)/quantize convert $(DEMO)/Wan2.1-T2V-small $(DEMO)/Wan2.1-T2V-small-gguf-q8_0 --recipe wan-gguf-q8_0.yaml
	$(BIN)/quantize verify $(DEMO)/Wan2.1-T2V-small-gguf-q8_0 --source $(DEMO)/Wan2.1-T2V-small
	$(BIN)/quantize sensitivity $(DEMO)/Wan2.1-T2V-small --recipe wan-gguf-q4_k_m.yaml --top 5
	$(BIN)/quantize sensitivity $(DEMO)/Wan2.1-T2V-small --recipe wan-gguf-q4_k_m.yaml --min-forward-sqnr 28 --write-recipe $(DEMO)/wan-q4-28db.yaml
	$(BIN)/quantize convert $(DEMO)/Wan2.1-T2V-small $(DEMO)/Wan2.1-T2V-small-q4-28db --recipe $(DEMO)/wan-q4-28db.yaml
	$(BIN)/quantize verify $(DEMO)/Wan2.1-T2V-small-q4-28db --source $(DEMO)/Wan2.1-T2V-small --forward
	$(BIN)/quantize plan $(DEMO)/Wan2.1-T2V-small --recipe wan-fp8.yaml --lora $(DEMO)/style-lora.safetensors:0.8
	$(BIN)/quantize convert $(DEMO)/Wan2.1-T2V-small $(DEMO)/Wan2.1-T2V-small-style-fp8 --recipe wan-fp8.yaml --lora $(DEMO)/style-lora.safetensors:0.8
	$(BIN)/quantize verify $(DEMO)/Wan2.1-T2V-small-style-fp8 --source $(DEMO)/Wan2.1-T2V-small

test: setup
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --durations 15

# the loader, format and calibration tests on the floor's torch, in an environment of their own (CI runs both);
# where that torch lacks a CPU kernel its tests skip and say so, where it changes a result they fail
$(FLOOR)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(FLOOR)
	$(FLOOR)/bin/pip install --quiet --disable-pip-version-check "torch==$(FLOOR_TORCH)"
	echo "torch==$(FLOOR_TORCH)" > $(FLOOR)/constraints.txt
	$(FLOOR)/bin/pip install --quiet --disable-pip-version-check -c $(FLOOR)/constraints.txt -e ".[dev]"
	touch $@

test-floor: $(FLOOR)/.installed
	$(FLOOR)/bin/python -m pytest -q -n auto --maxprocesses 4 -rs tests/loaders tests/formats tests/publish/test_calibrate.py

bench: setup
	$(BIN)/python benchmarks/bench_convert.py --preset 1.3b --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_convert.py --preset 1.3b --lora-only --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_4bit.py --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_parallel.py --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_verify.py --preset 1.3b --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_sensitivity.py --preset 1.3b --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_load.py --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_faults.py --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/family_rules.py --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/family_forward.py --layouts all --write docs/BENCHMARKS.md

# a 14B-shaped source (about 28.6 GB, generated once where the disk allows): memory does not grow with the model
bench-large: setup
	$(BIN)/python benchmarks/bench_large.py --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_large.py --forward --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_large_family.py --family minimax-h3 --preset 33b --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_large_family.py --family hunyuanvideo15 --preset 8.3b --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_large_family.py --family ltx2 --preset 19b --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_large_family.py --family ltx2 --preset 22b-2.5 --section ltx2.5 --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_large_family.py --family umt5 --preset xxl --layout pipeline --formats fp8_channel comfy_fp8 gguf --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_large_family.py --family umt5 --preset xxl --layout single --release-pth --formats fp8_channel comfy_fp8 gguf --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_large_family.py --family gemma3 --preset 12b --layout pipeline --formats fp8_channel comfy_fp8 gguf --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_large_family.py --family clip-vision --preset vit-h --layout single --formats fp8_channel torchao_int8 nf4 --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_large_family.py --family qwen25vl --preset 7b --layout single --formats fp8_channel gguf --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_large_family.py --family qwen-image --preset 20b --layout release --formats fp8_channel comfy_fp8 gguf --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_large_family.py --family qwen3vl --preset 8b --layout pipeline --formats fp8_channel comfy_fp8 nf4 --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_large_family.py --family gemma4 --preset 12b --layout pipeline --formats fp8_channel comfy_fp8 nf4 --write docs/BENCHMARKS.md

# llm-compressor, the fp8 peer of `make bench`, in its own virtual environment (never one of our dependencies);
# torch is held at the same CPU wheel so that nothing pulls a CUDA build
PEER := bench-data/peers/llmcompressor
bench-peers:
	python3 -m venv $(PEER)
	$(PEER)/bin/pip install --quiet --disable-pip-version-check "torch==2.13.0"
	echo "torch==2.13.0" > $(PEER)/constraints.txt
	$(PEER)/bin/pip install --quiet --disable-pip-version-check -c $(PEER)/constraints.txt "llmcompressor==0.14.0.1"

# on a machine with one CUDA GPU, at most 6 minutes: the tests marked gpu, then the GPU figures (H2D GB/s, each
# quantized Linear vs bf16, block offload vs resident) into docs/BENCHMARKS.md; without one it says so and exits 0
gpu-check: setup
	$(BIN)/python benchmarks/gpu_check.py --write docs/BENCHMARKS.md

# the generated parts of README.md and docs/ (tables from the registries, the CLI's help), rewritten in place;
# tests/test_docs.py fails while they are stale
docs: setup
	$(BIN)/python docs/make_docs.py

lint: setup
	$(BIN)/ruff check quantize loaders tests benchmarks docs/make_docs.py
	$(BIN)/ruff format --check quantize loaders tests benchmarks docs/make_docs.py

clean:
	rm -rf $(DEMO) bench-data .pytest_cache $(FLOOR)
