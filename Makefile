# Development tasks. They work on a fresh machine that has $(PYTHON): the
# first run builds the environment a target needs, later runs reuse it.
#
# Two TensorFlow versions are supported, each in its own venv:
#   .venv-latest   TensorFlow 2.21.0 and tf-keras 2.21.0 (extra
#                  `cpu-latest`): the first environment, that `make demo`,
#                  `make quick-start` and the README's commands use, and
#                  `make test-latest`; Python 3.11, 3.12 or 3.13 (PYTHON=)
#   .venv          TensorFlow 2.15.1 (extra `cpu`) with Horovod and the
#                  Estimator, built only by the targets that need it:
#                  `make test`, `make test-tf1`, `make horovod`,
#                  `make benchmarks`; Python 3.11 (TensorFlow 2.15 has no
#                  wheels for a newer Python)

PYTHON ?= python3.11
VENV := .venv
VENV_PY := $(VENV)/bin/python
PIP_VERSION := 24.3.1
# Extras to install; a GPU machine can use EXTRAS=gpu,test,plot.
EXTRAS ?= cpu,test,plot
# Written after a complete install. Reinstall when setup.py changes, and when
# epl/__init__.py appears or changes: the editable install only maps `epl` to
# this tree if the package existed when it was installed.
STAMP := $(VENV)/.epl-installed

.PHONY: venv venv-latest horovod tools test test-latest test-tf1 demo \
  quick-start keras-fit benchmarks benchmarks-smoke clean distclean FORCE

venv: $(STAMP)

$(VENV_PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): setup.py $(wildcard epl/__init__.py) | $(VENV_PY)
	$(VENV_PY) -m pip install --upgrade pip==$(PIP_VERSION)
	$(VENV_PY) -m pip install --use-pep517 -e '.[$(EXTRAS)]'
	touch $@

# Horovod (the `horovod` extra of setup.py, 0.28.1), built from source
# against the venv's TensorFlow (no build isolation; setup.py bdist_wheel
# needs `wheel`) with Gloo and without MPI, PyTorch and MXNet: about 15
# minutes on 2 cores the first time. pip keeps the wheel it built in its
# cache, so later installs (a new venv) reuse it without building.
WHEEL_VERSION := 0.48.0
HOROVOD_REQUIREMENT := $(shell grep -o '"horovod==[^"]*"' setup.py | tr -d '"')
HOROVOD_STAMP := $(VENV)/.horovod-installed
HOROVOD_BUILD_ENV := HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 \
  HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1

horovod: $(HOROVOD_STAMP)

$(HOROVOD_STAMP): setup.py | $(STAMP)
	$(VENV_PY) -m pip install wheel==$(WHEEL_VERSION)
	$(HOROVOD_BUILD_ENV) $(VENV_PY) -m pip install --no-build-isolation \
	  '$(HOROVOD_REQUIREMENT)'
	$(VENV_PY) -c "import horovod.tensorflow"
	touch $@

# The multi-worker tests run each job in private network and PID namespaces:
# they need `unshare` (util-linux) and `ip` (iproute2). Installed with apt
# when missing; without them those tests skip and say why.
tools:
	@command -v ip >/dev/null && command -v unshare >/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq iproute2 util-linux; } || \
	  echo "iproute2/util-linux could not be installed: multi-worker tests will skip"

# The suite runs on PYTEST_WORKERS processes (pytest-xdist), a test file
# per process at a time, so a file's module fixtures are built once: most
# of a test's time is single-threaded graph building and rewriting, so two
# processes on 2 cores take little more than half the time of one (TF 2.15:
# 489 s against 860 s on a fresh clone). PYTEST_WORKERS=0
# runs in this process (for pdb); on a GPU machine each process takes GPU
# memory, so use as many as the GPUs can hold.
PYTEST_WORKERS ?= 2
PYTEST := -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

test: venv horovod tools
	$(VENV_PY) $(PYTEST) tests

# The equivalence tests once more as ported TF1 scripts run them, under
# `tf.compat.v1.disable_v2_behavior()` (reference variables, v1 control
# flow): the subset TF1_BEHAVIOUR_TESTS of tests/conftest.py, under a
# minute on 2 cores. EPL_TEST_TF1_BEHAVIOUR=1 runs any test file so.
test-tf1: venv
	EPL_TEST_TF1_BEHAVIOUR=1 $(VENV_PY) $(PYTEST) -m tf1_behaviour tests

# The newest TensorFlow EPL is tested on. Since TF 2.16 `tf.keras` is Keras 3
# unless TF_USE_LEGACY_KERAS=1 makes it tf-keras (Keras 2), which
# `tf.compat.v1.layers` and the v1 RNN cells need; the Estimator is gone.
# Tests of what this version lacks (Horovod, the Estimator) skip and name
# the TensorFlow version. The environment sets TF_USE_LEGACY_KERAS=1
# itself, for every process of its Python, activated or not:
# env/tf_use_legacy_keras.pth in its site-packages (a value already set,
# such as 0, wins).
LATEST_VENV := .venv-latest
LATEST_PY := $(LATEST_VENV)/bin/python
LATEST_EXTRAS ?= cpu-latest,test,plot
LATEST_STAMP := $(LATEST_VENV)/.epl-installed
LEGACY_KERAS_PTH := env/tf_use_legacy_keras.pth

# `make test-latest PYTHON=python3.13` (CI) builds it with that Python. An
# existing .venv-latest is rebuilt when PYTHON, given on the command line or
# in the environment, is another Python version than the one it was built
# with; without PYTHON it is kept, whatever its Python.
python_version = $(shell $(1) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
ifneq ($(origin PYTHON),file)
LATEST_BUILT_WITH := $(call python_version,$(LATEST_PY))
LATEST_WANTED := $(call python_version,$(PYTHON))
ifneq ($(LATEST_BUILT_WITH),)
ifneq ($(LATEST_BUILT_WITH),$(LATEST_WANTED))
LATEST_REBUILD := FORCE
$(info $(LATEST_VENV) has Python $(LATEST_BUILT_WITH), PYTHON=$(PYTHON) is Python $(LATEST_WANTED): rebuilding $(LATEST_VENV))
endif
endif
endif

venv-latest: $(LATEST_STAMP)

$(LATEST_PY):
	$(PYTHON) -m venv $(LATEST_VENV)

$(LATEST_STAMP): setup.py $(wildcard epl/__init__.py) $(LEGACY_KERAS_PTH) \
  $(LATEST_REBUILD) | $(LATEST_PY)
	$(if $(LATEST_REBUILD),$(PYTHON) -m venv --clear $(LATEST_VENV))
	$(LATEST_PY) -m pip install --upgrade pip==$(PIP_VERSION)
	$(LATEST_PY) -m pip install --use-pep517 -e '.[$(LATEST_EXTRAS)]'
	cp $(LEGACY_KERAS_PTH) "$$($(LATEST_PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
	touch $@

test-latest: venv-latest tools
	$(LATEST_PY) $(PYTEST) tests

# Tiny BERT, 2 pipeline stages x 2 data-parallel replicas on 4 logical CPU
# devices, 4 micro-batches per step, on the newest TensorFlow EPL supports
# (35 s on 2 cores once the venv exists).
demo: venv-latest
	TF_CPP_MIN_LOG_LEVEL=2 $(LATEST_PY) examples/bert_large/train.py \
	  --config tiny --parallel pipeline_data --num_stages 2 \
	  --num_micro_batch 4 --num_cpu_devices 4 --steps 60 --log_every 10

# The quick-start script of the README, data parallel on 4 logical devices,
# in the same environment as the demo.
quick-start: venv-latest
	EPL_CLUSTER_NUM_CPU_DEVICES=4 TF_CPP_MIN_LOG_LEVEL=2 $(LATEST_PY) examples/quick_start/train.py

# The Keras fit example: data parallel with eager execution on, then a
# 2-stage pipeline with 4 micro-batches in graph mode, on 4 logical devices.
keras-fit: venv-latest
	EPL_CLUSTER_NUM_CPU_DEVICES=4 TF_CPP_MIN_LOG_LEVEL=2 $(LATEST_PY) -m examples.keras_fit.train --mode dp
	EPL_CLUSTER_NUM_CPU_DEVICES=4 TF_CPP_MIN_LOG_LEVEL=2 $(LATEST_PY) -m examples.keras_fit.train --mode pipeline

# Every benchmark at its standard size (real widths, at least 5 timed
# steps, anchors beside EPL), written to docs/benchmarks.md with the date,
# the machine, the commands and each one's time (sized for under 45
# minutes on 2 cores). The data-parallel and start-up benchmarks run on
# both TensorFlow versions, the others on .venv's (TensorFlow 2.15, with
# Horovod).
benchmarks: venv horovod venv-latest
	$(VENV_PY) -m benchmarks.all --python $(VENV_PY) --python $(LATEST_PY)

# The same at every benchmark's --smoke size (minutes; says nothing about
# speed; for CI), into docs/benchmarks.md too.
benchmarks-smoke: venv horovod venv-latest
	$(VENV_PY) -m benchmarks.all --smoke --python $(VENV_PY) \
	  --python $(LATEST_PY)

# Build outputs and caches; `distclean` also removes both environments.
clean:
	rm -rf build dist *.egg-info .pytest_cache
	find . -path ./$(VENV) -prune -o -path ./$(LATEST_VENV) -prune \
	  -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(LATEST_VENV)

# Makes a target that depends on it always out of date.
FORCE:
