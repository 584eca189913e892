# specd — the two quick-start commands are `make demo` and `make test`.
# Everything a fresh machine lacks is installed here: a project-local Python
# environment (.venv) with torch==2.11.0, whose libtorch the `tch` crate links.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

VENV        := $(CURDIR)/.venv
PYTHON      := $(VENV)/bin/python
TORCH_VER   := 2.11.0
TORCH_STAMP := $(VENV)/.torch-$(TORCH_VER)
PY_STAMP    := $(VENV)/.pydeps-5

# tch finds libtorch through the Python interpreter that has torch installed.
export LIBTORCH_USE_PYTORCH := 1
export PYTHON_SYS_EXECUTABLE := $(PYTHON)
# torch-sys's build script runs `python3` from PATH (`python` when VIRTUAL_ENV is set),
# not PYTHON_SYS_EXECUTABLE: put the venv first so it finds torch.
export VIRTUAL_ENV := $(VENV)
export PATH := $(VENV)/bin:$(PATH)
export SPECD_PYTHON := $(PYTHON)
# specd finds libtorch by its RUNPATH; the CUDA runtime test looks for the wheel's libraries on
# LD_LIBRARY_PATH. The venv's Python version is whatever `python3` made it, so the directory is
# looked up when a recipe runs (the venv may not exist when this file is read).
TORCH_LIB = $(shell ls -d $(VENV)/lib/python3*/site-packages/torch/lib 2>/dev/null | head -n 1)
OUTER_LD_LIBRARY_PATH := $(LD_LIBRARY_PATH)
export LD_LIBRARY_PATH = $(TORCH_LIB)$(if $(OUTER_LD_LIBRARY_PATH),:$(OUTER_LD_LIBRARY_PATH))

CARGO ?= cargo

.PHONY: all build test lint demo demo-rebuild demo-ship bench bench-llama-cpp torch pydeps deploy-check gpu-bundle-check gpu-dry-run fuzz clean help

all: build

help:
	@echo "make demo         - all three roles on loopback with the shipped demo pair (models/demo): a streamed completion, the speedup, curl"
	@echo "make test         - install what is missing, then lint and run every test (40-60 minutes on 2 cores)"
	@echo "make demo-rebuild - train a demo pair here (specd models demo, about 30-60 minutes on 2 cores) and run the demo with it"
	@echo "make demo-ship    - train the shipped pair's recipe (hours on 2 cores; resumes where it stopped) and write it to models/demo"
	@echo "make build        - build target/release/specd"
	@echo "make all          - the same as make build (what plain make runs)"
	@echo "make lint         - rustfmt, clippy (release, every target) and the no-file-circles check"
	@echo "make bench        - run the criterion benchmarks (sampling round, model verify vs decode)"
	@echo "make bench-llama-cpp - build llama.cpp from PyPI's llama-cpp-python sdist, convert the demo target, time it (decode, prefill; 1 and 2 threads)"
	@echo "make fuzz         - build the fuzz targets (stable cargo-fuzz) and fuzz each for 20 s"
	@echo "make deploy-check - render and validate deploy/k8s, specd --check-config on every container"
	@echo "make gpu-bundle-check - build the GPU check's bundle (target/gpu-check) and check it fits in 64 MiB"
	@echo "make gpu-dry-run  - run that bundle's stages on the CPU (--quick): every one a CPU can run must pass"
	@echo "make torch        - install torch $(TORCH_VER) into .venv (what specd links)"
	@echo "make pydeps       - install the tests' Python packages into .venv (transformers, grpcio, openai, ...)"
	@echo "make clean        - remove the build outputs"
	@echo "make help         - this list"

$(PYTHON):
	python3 -m venv $(VENV)

# torch is about 4.6 GB with its CUDA libraries; it also runs on CPU-only machines.
$(TORCH_STAMP): | $(PYTHON)
	$(PYTHON) -m pip install --disable-pip-version-check -q "torch==$(TORCH_VER)"
	touch $@

torch: $(TORCH_STAMP)

# transformers (PyPI, with torch) makes the model tests' tiny random checkpoints and
# reference logits under target/fixtures; nothing is downloaded from a model hub.
# grpcio and grpcio-tools run the Python client test (stubs generated from proto/);
# grpcio-reflection is the reflection client every role is tested against; openai is the
# official client the HTTP API is tested with.
# kubernetes-validate checks the rendered Kubernetes manifests offline (its schemas are in
# the wheel).
TRANSFORMERS_VER := 5.24.0
GRPCIO_VER := 1.76.0
KUBERNETES_VALIDATE_VER := 1.37.0
OPENAI_VER := 3.57.0
# transformers renders chat templates with jinja2 (torch brings it too): the chat-template
# tests compare specd-text with it.
JINJA2_VER := 3.1.6
$(PY_STAMP): $(TORCH_STAMP)
	$(PYTHON) -m pip install --disable-pip-version-check -q "transformers==$(TRANSFORMERS_VER)" \
		"grpcio==$(GRPCIO_VER)" "grpcio-tools==$(GRPCIO_VER)" "grpcio-reflection==$(GRPCIO_VER)" \
		"kubernetes-validate==$(KUBERNETES_VALIDATE_VER)" "openai==$(OPENAI_VER)" "jinja2==$(JINJA2_VER)"
	touch $@

pydeps: $(PY_STAMP)

build: torch
	$(CARGO) build --release --locked -p specd

# clippy in the release profile: its build scripts and proc macros (torch-sys compiles
# libtorch's C++ bindings, about 2 minutes here) are then the ones `make test` builds with,
# not a second, debug set.
# The tests' `testing` features (test stand-ins: injected faults, wrong rules) are unified into
# every workspace build that includes the tests, so the binary as users build it, without
# them, is checked on its own. No two files of a crate may use each other
# (scripts/file_circles.py).
lint: torch
	$(CARGO) fmt --all --check
	$(CARGO) clippy --release --workspace --all-targets --locked -- -D warnings
	$(CARGO) check --release --locked -p specd
	for src in */src; do python3 scripts/file_circles.py "$$src"; done

# Release: the whole-system law tests draw 50 000 generations per check through gRPC.
# The fuzz crate is outside the workspace, so lint does not build it: its targets run first,
# so a change that breaks them fails in minutes rather than after the long tests.
test: lint pydeps
	$(MAKE) fuzz
	$(CARGO) test --workspace --release --locked
	$(MAKE) gpu-bundle-check
	$(MAKE) gpu-dry-run

# The fuzz targets (fuzz/README.md), a minute in all; the first run installs cargo-fuzz and
# builds them. Longer: scripts/fuzz.sh run SECONDS [TARGET].
fuzz:
	./scripts/fuzz.sh run 60

# The Kubernetes manifests alone (part of `make test`, which skips them loudly without kubectl;
# here kubectl is required): kustomize, kubernetes-validate --strict, specd --check-config.
deploy-check: torch pydeps
	SPECD_REQUIRE_KUBECTL=1 $(CARGO) test --release --locked -p specd --test deploy_manifests

# The GPU check's bundle (scripts/gpu-check.sh): after the tests it reuses their release
# build and adds one bench binary; it fails when the bundle would not fit in what a lent GPU
# machine is carried (64 MiB).
gpu-bundle-check: torch
	CARGO=$(CARGO) ./scripts/gpu-check.sh bundle

# The GPU check's stages on this CPU, shrunk (--quick): the one GPU run we may get must not
# be the first time they run. A stage that fails fails the target; one that needs CUDA is
# skipped with the reason. The report stays beside the build, out of the bundle.
gpu-dry-run: pydeps
	OUT=$(CURDIR)/target/gpu-check-cpu GPU_DEVICE=cpu ./scripts/gpu-check.sh run --quick

bench: torch
	$(CARGO) bench -p specd-sampling --bench round
	$(CARGO) bench -p specd-model --bench verify_vs_decode

demo: build
	./scripts/demo.sh

# A pair trained on this host (the `demo` preset, sized for tens of minutes), then the demo
# with it; the stages are cached in models/demo-build.
demo-rebuild: build
	./target/release/specd models demo --out models/demo-build
	SPECD_DEMO_DIR=models/demo-build ./scripts/demo.sh

# The shipped pair's recipe: hours on 2 cores, checkpointed every 5 minutes, so running it
# again resumes where it stopped; then the copy probe (transformers) into its card.
demo-ship: build pydeps
	./target/release/specd models demo --preset shipped --matmul f32 --out models/shipped-build --ship-to models/demo
	$(PYTHON) scripts/copy_probe.py models/demo/target --card models/demo/card.json

# llama.cpp on this CPU, for the host engine's figures to compare with (BENCHMARKS.md); not
# part of make test.
bench-llama-cpp: pydeps
	scripts/llama_cpp_bench.sh all

clean:
	$(CARGO) clean
	rm -rf fuzz/target
