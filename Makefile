# Hearth: `make serve` starts the platform on the demo model, `make test` lints, type-checks and runs the suite.
# Both create .venv and install everything they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
UNAME := $(shell uname -s)
# The `mkl` extra: Intel MKL, one of the BLAS libraries `hearth` measures (a ~230 MB wheel; its marker
# installs nothing off x86-64 Linux). `make MKL=0 ...` leaves it out.
MKL ?= 1
# MLX's CUDA build (the `cuda` extra) where an NVIDIA driver is loaded; `make CUDA=0 ...` keeps the CPU build,
# `make CUDA=1 ...` asks for the CUDA one. On a GPU no CPU BLAS matters, so MKL is left out there.
CUDA ?= $(if $(wildcard /proc/driver/nvidia/version),1,0)
ifeq ($(CUDA),1)
MKL := 0
endif
comma := ,
# `make serve` installs what serving needs and the SDKs the README's examples use (the `clients` extra);
# `make test`, `make docs` and `make bench` add the tools (the `test` extra) and, since the suite runs
# Hearth on Redis and on PostgreSQL too (tests/e2e/test_redis.py, tests/pg.py), the `redis` and `postgres`
# extras.
EXTRAS := clients$(if $(filter 1,$(MKL)),$(comma)mkl)
TEST_EXTRAS := test$(comma)redis$(comma)postgres
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: serve test check-slow check-demo lint docs blas browser git media redis postgres deps test-deps cpu-build bench clean

deps: $(VENV)/.installed $(if $(filter 1,$(CUDA)),$(VENV)/.cuda,cpu-build)
test-deps: deps $(VENV)/.test-installed

# pip byte-compiles what it installs on one core (about half of a fresh install's time on 2 cores);
# compileall does it on every core afterwards. It exits 1 for the few files in wheels that are not
# valid on this Python (torch's py312 test helpers), which pip's own compile skips too.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
ifeq ($(UNAME),Linux)
	# CPU torch first: xgrammar imports torch, and a plain resolve pulls a multi-GB CUDA build.
	$(BIN)/pip install -q --no-compile torch==2.13.0
endif
	$(BIN)/pip install -q --no-compile -e '.[$(EXTRAS)]'
	@echo "compiling the installed packages to bytecode on every core (it prints nothing; 1 to 3 minutes on 2 cores)"
	$(BIN)/python -m compileall -qq -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
	touch $@

# Both MLX builds ship mlx/lib/libmlx.so: with the CPU build removed, the CUDA build is installed again over
# whatever it left, so the library MLX loads is the CUDA one (`hearth` then reports the GPU in its log and /stats).
# Any later `pip install` of Hearth puts the CPU build back (a base dependency on Linux), so it swaps again.
define cuda_swap
$(BIN)/pip uninstall -q -y mlx-cpu
$(BIN)/pip install -q --no-compile --no-deps --force-reinstall "mlx-cuda-13==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("mlx"))')"
endef

$(VENV)/.test-installed: $(VENV)/.installed pyproject.toml
	$(BIN)/pip install -q --no-compile -e '.[$(EXTRAS)$(comma)$(TEST_EXTRAS)$(if $(filter 1,$(CUDA)),$(comma)cuda)]'
	$(if $(filter 1,$(CUDA)),$(cuda_swap))
	@echo "compiling the packages just installed to bytecode on every core (it prints nothing)"
	$(BIN)/python -m compileall -qq -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
	touch $@

$(VENV)/.cuda: $(VENV)/.installed
	$(BIN)/pip install -q --no-compile -e '.[cuda]'
	$(cuda_swap)
	touch $@

# `make CUDA=0 …` after a CUDA install: the CPU build back in place of the CUDA one.
cpu-build: $(VENV)/.installed
	@if [ -e $(VENV)/.cuda ]; then \
		$(BIN)/pip uninstall -q -y mlx-cuda-13 && \
		$(BIN)/pip install -q --no-compile --no-deps --force-reinstall "mlx-cpu==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("mlx"))')" && \
		rm $(VENV)/.cuda; fi

# System packages from Debian's apt where missing (scripts/system-packages.sh says what each kind is for):
# each kind on its own, or several in one `apt-get update` and one install, as `serve` and `test` ask.
SYSTEM := blas browser git media redis postgres
$(SYSTEM):
	@sh scripts/system-packages.sh $@

# The demo chat model trains in the background on a first run: served from its first checkpoint
# (about a minute), swapped for better ones as it trains; then the demo speech model, when the library
# has no Whisper (see docs/using/first-run.md).
serve: deps
	@sh scripts/system-packages.sh blas git media
	$(BIN)/hearth serve --host $(HOST) --port $(PORT) --build-demo

# Lint and type check first: the suite runs only on a clean tree.
# Bytecode for Hearth's own modules first: the suite starts a few hundred `hearth` processes, and
# where PYTHONDONTWRITEBYTECODE is set each would compile them again (~0.3 s a start on 2 cores).
# The suite runs in parallel, one pytest-xdist worker per core (at most 4), a whole file to a worker.
# The few tests that time this machine (the `serial` mark) need it to themselves: check-demo runs them.
# The tests of whole processes killed, restarted or spread over nodes, of PostgreSQL and Redis, and of the BLAS
# measurement (the `slow` mark, about a third of the suite's CPU) run in check-slow, which CI runs after this.
test: test-deps lint
	@sh scripts/system-packages.sh $(SYSTEM)
	$(BIN)/python -m compileall -q core inference hub serving jobs chat memory hearth config tests > /dev/null
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -n auto --maxprocesses=4 --dist loadfile --durations=15 \
		-m "not serial and not slow" tests --ignore=tests/demo

# The `slow` tests, in parallel as `test` runs the rest (about 3 minutes on 2 cores). CI runs it after `make test`.
check-slow: test-deps
	@sh scripts/system-packages.sh $(SYSTEM)
	$(BIN)/python -m compileall -q core inference hub serving jobs chat memory hearth config tests > /dev/null
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -n auto --maxprocesses=4 --dist loadfile --durations=10 \
		-m "slow and not serial" tests --ignore=tests/demo

# What the trained demo models can do (tests/demo): trains the demo chat, vision and speech models first, in
# the run's own homes (side by side, about 20 minutes on 2 cores), then checks their answers; then the tests that time this
# machine (the `serial` mark), alone. CI runs it after `make test`.
check-demo: test-deps
	@sh scripts/system-packages.sh blas browser git media
	$(BIN)/python -m compileall -q core inference hub serving jobs chat memory hearth config tests > /dev/null
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q --durations=15 tests/demo
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -m serial tests --ignore=tests/demo

# ruff over everything; mypy over the files [tool.mypy] names (core, the engine, protocols and routes).
lint: test-deps
	$(BIN)/ruff check .
	$(BIN)/mypy

# The manual (docs/, mkdocs.yml) as a site in site/; strict, so a dead link or anchor, a page left out of the
# nav or a route no page shows fails it (tests/core/test_docs_site.py builds it in the suite too).
docs: test-deps
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: test-deps blas
	$(BIN)/python bench/decode.py
	$(BIN)/python bench/throughput.py

clean:
	rm -rf $(VENV) .pytest_cache site
