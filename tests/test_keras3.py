"""What EPL supports of Keras 3 (tf.keras on TF 2.16+ without
TF_USE_LEGACY_KERAS): Keras 3 layers trained by a tf.compat.v1.train
optimizer under data parallelism train exactly; Keras 3 optimizers,
Model.fit/train_on_batch, epl.split and tf.compat.v1.layers raise an error
naming Keras 3, the TensorFlow version and the fix, which `epl.init` has
already logged unless the environment chose Keras 3.

`make test-latest` runs the suite with TF_USE_LEGACY_KERAS=1 (tf.keras is
tf-keras there; .venv-latest sets it itself), so each scenario runs in a
subprocess with TF_USE_LEGACY_KERAS=0 (the environment's choice) or empty
(as if unset): tests/clients/keras3_scenarios.py.
"""
import importlib.metadata
import os
import pathlib
import subprocess
import sys

import pytest
import tensorflow as tf

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "clients" / "keras3_scenarios.py"


def _keras3_version():
  try:
    version = importlib.metadata.version("keras")
  except importlib.metadata.PackageNotFoundError:
    return None
  return version if version.startswith("3.") else None


def _installed_keras():
  try:
    return importlib.metadata.version("keras")
  except importlib.metadata.PackageNotFoundError:
    return "not installed"


KERAS3 = _keras3_version()
pytestmark = pytest.mark.skipif(
    KERAS3 is None or tf.__version__.startswith(("2.15.", "2.14.")),
    reason="Keras 3 is not what tf.keras is without TF_USE_LEGACY_KERAS on "
           "TensorFlow %s (keras package: %s): Keras 3 comes with TF 2.16+" % (
               tf.__version__, _installed_keras()))


def _run(scenario, legacy_keras="0"):
  """What the scenario prints, then what it logs."""
  env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3",
             TF_USE_LEGACY_KERAS=legacy_keras)
  result = subprocess.run([sys.executable, str(SCRIPT), scenario],
                          capture_output=True, text=True, timeout=240,
                          check=False, env=env, cwd=str(ROOT))
  assert result.returncode == 0, result.stdout + result.stderr
  return result.stdout + result.stderr


@pytest.mark.parametrize("replicas", [2, 4])
def test_keras3_layers_data_parallel_equal_single_device(replicas):
  out = _run("layers_dp_%d" % replicas)
  assert "KERAS3_LAYERS_OK tf=%s keras=3." % tf.__version__ in out, out
  # Logical CPU devices of one process: the 4 variables exist once, every
  # replica reads them (shared weights), and no replica has copies.
  assert "replicas=%d copies=0" % replicas in out, out
  assert "EPL shared weights: 8 trained variables" in out, out
  # TF_USE_LEGACY_KERAS=0 chose Keras 3: epl.init says so at INFO only.
  assert ("[EPL INFO] epl.init: TensorFlow %s uses Keras 3" % tf.__version__
          in out), out
  assert "[EPL WARNING]" not in out, out


@pytest.mark.parametrize("scenario, what", [
    ("optimizer_apply", "Keras 3's Adam.apply"),
    ("model_fit", "Keras 3's Sequential.fit"),
    ("train_on_batch", "Keras 3's Sequential.train_on_batch"),
    ("eager_fit", "Keras 3's Sequential.fit"),
    ("eager_apply", "Keras 3's Adam.apply"),
])
def test_keras3_training_entry_points_name_keras3_and_the_fix(scenario,
                                                              what):
  out = _run(scenario)
  assert "KERAS3_ERROR EPL does not support %s" % what in out, out
  assert "TensorFlow %s uses Keras 3." % tf.__version__ in out, out
  major_minor = tf.__version__.rsplit(".", 1)[0]
  assert "pip install 'tf-keras~=%s.0'" % major_minor in out, out
  assert "TF_USE_LEGACY_KERAS=1" in out, out
  assert "tf.compat.v1.train optimizer" in out, out
  assert "call the Keras 3 optimizer in your own @tf.function" in out, out


def test_keras3_split_names_the_fix():
  out = _run("split")
  assert "KERAS3_ERROR epl.split needs EPL's Keras layer hooks" in out, out
  assert "TensorFlow %s uses Keras 3" % tf.__version__ in out, out
  assert "pip install 'tf-keras~=%s.0'" % tf.__version__.rsplit(".", 1)[0] \
      in out, out
  assert "TF_USE_LEGACY_KERAS=1" in out, out


def test_init_warns_of_keras3_and_v1_layers_raise_the_fix():
  """TF_USE_LEGACY_KERAS not chosen: epl.init warns at once, in one line,
  of what will fail and the fix; the first tf.compat.v1.layers call raises
  EPL's error, not TensorFlow's "`dense` is not available with Keras 3"."""
  out = _run("v1_layers", legacy_keras="")
  warnings = [line for line in out.splitlines()
              if line.startswith("[EPL WARNING] epl.init: TensorFlow")]
  assert len(warnings) == 1, out
  assert "uses Keras 3: tf.compat.v1.layers" in warnings[0]
  assert ("Fix: pip install 'tf-keras~=%s.0' and set TF_USE_LEGACY_KERAS=1"
          % tf.__version__.rsplit(".", 1)[0]) in warnings[0]
  (error,) = [line for line in out.splitlines()
               if line.startswith("KERAS3_ERROR")]
  assert error.startswith(
      "KERAS3_ERROR tf.compat.v1.layers.dense is not available: TensorFlow "
      "%s uses Keras 3" % tf.__version__), out
  assert "and set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported" in \
      error


@pytest.mark.parametrize("scenario, micro_batches", [
    ("eager_loop_dp", 1), ("eager_loop_accumulation", 4)])
def test_keras3_optimizer_in_an_eager_tf_function_loop_equals_plain(
    scenario, micro_batches):
  out = _run(scenario)
  assert ("KERAS3_EAGER_LOOP_OK tf=%s keras=3." % tf.__version__ in out and
          "micro_batches=%d" % micro_batches in out), out
  assert "4 model replica(s) x 1 TaskGraph(s)" in out, out
