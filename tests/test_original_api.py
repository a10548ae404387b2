"""The original EPL's public API as its users call it (issue 20, item 5):
`epl.init` and `epl.Env`, collections, nesting errors, the third pipeline
schedule, the cluster and its VirtualDevices, the profiler's arguments and
epl-launch's flags."""
import pytest
import tensorflow as tf

import epl
from epl.ir.phase import Phase
from epl.passes import schedule
from epl.tools import timeline
from tests import training

F, B = "forward", "backward"


# --------------------------------------------------- PreferBackwardOptimizer


def test_prefer_backward_optimizer_keeps_one_more_forward_in_flight():
  order = schedule.stage_order("PreferBackwardOptimizer", 3, 1, 5)
  assert order == [(Phase.FORWARD, 0), (Phase.FORWARD, 1), (Phase.FORWARD, 2),
                   (Phase.BACKWARD, 0), (Phase.FORWARD, 3),
                   (Phase.BACKWARD, 1), (Phase.FORWARD, 4),
                   (Phase.BACKWARD, 2), (Phase.BACKWARD, 3),
                   (Phase.BACKWARD, 4)]
  # The last stage runs 1F1B; no stage holds more than all micro-batches.
  assert schedule.warm_up("PreferBackwardOptimizer", 3, 2, 5) == 1
  assert schedule.warm_up("PreferBackwardOptimizer", 3, 0, 3) == 3
  assert [schedule.warm_up("PreferBackward", 3, s, 5) for s in range(3)] == [
      3, 2, 1]
  assert epl.Config({"pipeline.strategy": "preferbackwardoptimizer"}) \
      .pipeline.strategy == "PreferBackwardOptimizer"


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_prefer_backward_optimizer_trains_as_one_device(optimizer):
  micro, micro_batches = 8, 4
  model = training.staged_model((16, 16, 1))
  expected, _, _ = training.train(model, optimizer,
                                  batch_size=micro * micro_batches,
                                  with_epl=False)
  actual, _, _ = training.train(
      model, optimizer, batch_size=micro, default_strategy=False,
      config={"cluster.num_cpu_devices": 3,
              "pipeline.num_micro_batch": micro_batches,
              "pipeline.strategy": "PreferBackwardOptimizer"})
  training.assert_close(actual, expected)
  assert actual["global_step"] == 5


def test_prefer_backward_optimizer_traced_order():
  epl.init(epl.Config({"cluster.num_cpu_devices": 3,
                       "pipeline.num_micro_batch": 4,
                       "pipeline.strategy": "PreferBackwardOptimizer"}))
  with tf.Graph().as_default():
    x, y = training.input_batch(8)
    loss = tf.reduce_mean(tf.square(
        training.staged_model((16, 16, 1))(x) - y))
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      _, trace = timeline.trace_step(session, train_op)
  assert trace.order(0) == [(F, 0), (F, 1), (F, 2), (F, 3),
                            (B, 0), (B, 1), (B, 2), (B, 3)]
  assert trace.order(1) == [(F, 0), (F, 1), (F, 2), (B, 0), (F, 3),
                            (B, 1), (B, 2), (B, 3)]
  assert trace.order(2) == [(F, 0), (B, 0), (F, 1), (B, 1), (F, 2), (B, 2),
                            (F, 3), (B, 3)]


