"""Shared test set-up: graph mode, quiet TensorFlow, EPL reset per test."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import epl  # noqa: E402
from tests import tf_versions  # noqa: E402

tf.compat.v1.disable_eager_execution()


def pytest_configure(config):
  config.addinivalue_line(
      "markers",
      "tf_before((major, minor), reason): the test needs a TensorFlow older "
      "than major.minor; on a newer one it skips, naming the version and "
      "the reason (tests/tf_versions.py)")


def pytest_collection_modifyitems(items):
  for item in items:
    for mark in item.iter_markers("tf_before"):
      if tf_versions.TF >= tuple(mark.args[0]):
        item.add_marker(pytest.mark.skip(
            reason=tf_versions.skip_reason(mark.kwargs["reason"])))


@pytest.fixture(autouse=True)
def _fresh_epl():
  """Every test starts and ends without EPL hooks or state."""
  epl.shutdown()
  yield
  epl.shutdown()


@pytest.fixture(name="tf1_tensor_shapes")
def _tf1_tensor_shapes():
  """The test runs with TF1 tensor shapes, as after disable_v2_behavior():
  `shape[i]` is a `Dimension`, whose unknown size is not None."""
  tf.compat.v1.disable_v2_tensorshape()
  yield
  tf.compat.v1.enable_v2_tensorshape()
