"""Which TensorFlow the tests run on, and what that version lacks.

The suite runs on two TensorFlow versions (`make test`: 2.15, `make
test-latest`: the newest EPL supports). What only exists on the older one
skips on the newer one and says so with the version, so that a skip there
is never mistaken for a missing install:

    @pytest.mark.tf_before((2, 16), reason=tf_versions.ESTIMATOR_GONE)
    def test_...

(the marker is applied in conftest.py), or, inside a fixture or test,
`tf_versions.require_horovod()`.
"""
import pytest
import tensorflow as tf


def parse(version):
  """(major, minor) of a version string such as "2.21.0" or "2.16.0rc1"."""
  major, minor = version.split(".")[:2]
  return int(major), int("".join(c for c in minor if c.isdigit()))


TF = parse(tf.__version__)

# The newest TensorFlow that Horovod 0.28.1 (its last release) builds against.
HOROVOD_NEWEST_TF = (2, 15)
# The TensorFlow of `make test`, the primary environment.
PRIMARY_TF = (2, 15)
ESTIMATOR_GONE = "tf.estimator was removed in TensorFlow 2.16"


def skip_reason(reason):
  return "TensorFlow %s: %s" % (tf.__version__, reason)


def require_horovod():
  """Skips the caller where Horovod cannot be: on a TensorFlow it does not
  build against, or (older TensorFlow) when it is not installed."""
  if TF > HOROVOD_NEWEST_TF:
    pytest.skip(skip_reason(
        "Horovod 0.28.1 does not build against it (%d.%d is the newest it "
        "builds against), so `make test-latest` runs without Horovod"
        % HOROVOD_NEWEST_TF))
  pytest.importorskip(
      "horovod.tensorflow",
      reason="Horovod is not installed: `make horovod` (or `make test`) "
             "builds Horovod 0.28.1 with TensorFlow and Gloo")
