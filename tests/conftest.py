"""Shared test set-up: graph mode, quiet TensorFlow, EPL reset per test."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import epl  # noqa: E402
from tests import tf_versions  # noqa: E402

# EPL_TEST_TF1_BEHAVIOUR=1 (`make test-tf1`) runs the tests as a TF1 script
# ported to TF2 runs: `disable_v2_behavior()` gives reference variables
# (VariableV2) and v1 control flow; otherwise graph mode with TF2's
# resource variables and control flow v2.
TF1_BEHAVIOUR = os.environ.get("EPL_TEST_TF1_BEHAVIOUR") == "1"
if TF1_BEHAVIOUR:
  tf.compat.v1.disable_v2_behavior()
else:
  tf.compat.v1.disable_eager_execution()


def pytest_configure(config):
  config.addinivalue_line(
      "markers",
      "tf_before((major, minor), reason): the test needs a TensorFlow older "
      "than major.minor; on a newer one it skips, naming the version and "
      "the reason (tests/tf_versions.py)")
  config.addinivalue_line(
      "markers",
      "tf1_behaviour: the test is in the subset `make test-tf1` runs under "
      "EPL_TEST_TF1_BEHAVIOUR=1 (the equivalence tests)")
  config.addinivalue_line(
      "markers",
      "tf2_behaviour_only(reason): under EPL_TEST_TF1_BEHAVIOUR=1 the test "
      "skips, giving the reason")


def pytest_collection_modifyitems(items):
  for item in items:
    for mark in item.iter_markers("tf_before"):
      if tf_versions.TF >= tuple(mark.args[0]):
        item.add_marker(pytest.mark.skip(
            reason=tf_versions.skip_reason(mark.kwargs["reason"])))
    if TF1_BEHAVIOUR:
      for mark in item.iter_markers("tf2_behaviour_only"):
        item.add_marker(pytest.mark.skip(
            reason="EPL_TEST_TF1_BEHAVIOUR=1: " + mark.kwargs["reason"]))


@pytest.fixture(autouse=True)
def _fresh_epl():
  """Every test starts and ends without EPL hooks or state."""
  epl.shutdown()
  yield
  epl.shutdown()
