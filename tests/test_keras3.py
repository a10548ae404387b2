"""What EPL supports of Keras 3 (tf.keras on TF 2.16+ without
TF_USE_LEGACY_KERAS): Keras 3 layers trained by a tf.compat.v1.train
optimizer under data parallelism train exactly; Keras 3 optimizers,
Model.fit/train_on_batch and epl.split raise an error naming Keras 3, the
TensorFlow version and the fix.

`make test-latest` runs the suite with TF_USE_LEGACY_KERAS=1 (tf.keras is
tf-keras there), so each scenario runs in a subprocess without that
variable: tests/clients/keras3_scenarios.py.
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


def _run(scenario):
  env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
  env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
  result = subprocess.run([sys.executable, str(SCRIPT), scenario],
                          capture_output=True, text=True, timeout=240,
                          check=False, env=env, cwd=str(ROOT))
  assert result.returncode == 0, result.stdout + result.stderr
  return result.stdout


@pytest.mark.parametrize("replicas", [2, 4])
def test_keras3_layers_data_parallel_equal_single_device(replicas):
  out = _run("layers_dp_%d" % replicas)
  assert "KERAS3_LAYERS_OK tf=%s keras=3." % tf.__version__ in out, out
  # Each of the 4 variables has a copy on every other replica.
  assert "replicas=%d copies=%d" % (replicas, 4 * (replicas - 1)) in out, out


@pytest.mark.parametrize("scenario, what", [
    ("optimizer_apply", "Keras 3's Adam.apply"),
    ("model_fit", "Keras 3's Sequential.fit"),
    ("train_on_batch", "Keras 3's Sequential.train_on_batch"),
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


def test_keras3_split_names_the_fix():
  out = _run("split")
  assert "KERAS3_ERROR epl.split needs EPL's Keras layer hooks" in out, out
  assert "TensorFlow %s uses Keras 3" % tf.__version__ in out, out
  assert "pip install 'tf-keras~=%s.0'" % tf.__version__.rsplit(".", 1)[0] \
      in out, out
  assert "TF_USE_LEGACY_KERAS=1" in out, out
