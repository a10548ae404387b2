"""Batches fed through placeholders: the user feeds the step's whole batch,
as on one device, and each replica and micro-batch trains on its part."""
import logging

import pytest
import tensorflow as tf

import epl
from tests import training

STEPS = 4
GLOBAL_BATCH = 16


def _train_fed(config=None, rows=GLOBAL_BATCH, optimizer="momentum"):
  values, _ = training.train_fed(config, optimizer=optimizer, rows=rows,
                                 steps=STEPS)
  return values


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


def test_fed_batch_micro_batches_run_as_a_loop(caplog):
  # The default pipeline.accumulation "loop": the parts of a fed batch
  # reach the loop as an input read's batches do, so that the forward and
  # backward pass are not copied per micro-batch.
  config = {"cluster.num_cpu_devices": 2, "pipeline.num_micro_batch": 4}
  rows = 32  # 2 replicas x 4 micro-batches x 4 rows
  expected = _train_fed(rows=rows, optimizer="adam")
  with caplog.at_level(logging.INFO, logger="epl"), \
      training.epl_logs_caught(caplog):
    actual, graph = training.train_fed(config, optimizer="adam", rows=rows,
                                       steps=STEPS)
  training.assert_close(actual, expected)
  assert "micro-batches: loop" in caplog.text
  assert "not as a loop" not in caplog.text, caplog.text
  assert any(op.type == "Exit" for op in graph.get_operations())
  copied = [op.name for op in graph.get_operations()
            if op.name.startswith("EPL_MICRO_BATCH_1/")]
  assert not copied, copied
