"""Batches fed through placeholders: the user feeds the step's whole batch,
as on one device, and each replica and micro-batch trains on its part."""
import pytest
import tensorflow as tf

import epl
from tests import training

STEPS = 4
GLOBAL_BATCH = 16


def _train_fed(config=None, rows=GLOBAL_BATCH):
  return training.train_fed(config, rows=rows, steps=STEPS)


@pytest.mark.parametrize("config", [
    {"cluster.num_cpu_devices": 4},
    {"cluster.num_cpu_devices": 2, "pipeline.num_micro_batch": 2},
], ids=["4_replicas", "2_replicas_x_2_micro_batches"])
def test_fed_global_batch_trains_as_on_one_device(config):
  expected = _train_fed()
  actual = _train_fed(config)
  training.assert_close(actual, expected)


def test_fed_batch_that_does_not_divide_is_a_clear_error():
  # One line, raised before the step runs: no TensorFlow traceback inside.
  with pytest.raises(ValueError) as raised:
    _train_fed({"cluster.num_cpu_devices": 4}, rows=6)
  message = str(raised.value)
  assert not isinstance(raised.value, tf.errors.OpError)
  assert "\n" not in message and raised.value.__cause__ is None
  assert "placeholder 'Placeholder' has 6 rows" in message
  assert "multiple of 4" in message


@pytest.mark.usefixtures("tf1_tensor_shapes")
def test_fed_batch_with_tf1_tensor_shapes():
  # The placeholder's unknown batch size is Dimension(None), not None.
  config = {"cluster.num_cpu_devices": 2, "pipeline.num_micro_batch": 2}
  expected = _train_fed()
  actual = _train_fed(config)
  training.assert_close(actual, expected)
