"""A session that ran the graph before its training step was built
(`epl.runtime.stale_sessions`): TensorFlow ignores EPL's rewrite of ops
such a session knows, so its training run raises, naming the fix, in data
parallel and pipeline layouts, also when the rewrite happened elsewhere
(MonitoredTrainingSession freezing the graph); a new session opened after
the train op is built trains as plain single-device TensorFlow does."""
import pytest
import tensorflow as tf

import epl
from epl.runtime.stale_sessions import StaleSessionError
from tests import training

# One replica's micro-batch; both layouts train a global batch of 4 of them
# (4 replicas, or 4 micro-batches of one pipeline), plain TF all 4 at once.
BATCH = 8
GLOBAL_BATCH = 4 * BATCH
LAYOUTS = {
    "data_parallel": ({"cluster.num_cpu_devices": 4}, True),
    "pipeline": ({"cluster.num_cpu_devices": 2,
                  "pipeline.num_micro_batch": 4}, False),
}


def _start(layout, with_epl):
  """Starts EPL for `layout` (or shuts it down); returns the layout's
  model: one-device replicas, or two pipeline stages."""
  config, data_parallel = LAYOUTS[layout]
  if not with_epl:
    epl.shutdown()
  else:
    epl.init(epl.Config(config))
    if data_parallel:
      epl.set_default_strategy(epl.replicate(device_count=1))
  return training.layers_model if data_parallel else training.staged_model()


def _initialised_before_train_op(layout, with_epl=True, new_session=False):
  """Builds the model, initialises it in a session, then builds the train
  op and trains 5 steps, in that session or in a `new_session` opened
  after the train op (initialised there); returns the trained values."""
  model = _start(layout, with_epl)
  with tf.Graph().as_default() as graph:
    x, y = training.input_batch(BATCH if with_epl else GLOBAL_BATCH)
    loss = tf.reduce_mean(tf.square(model(x) - y))
    init = tf.compat.v1.global_variables_initializer()
    session = tf.compat.v1.Session()
    session.run(init)
    train_op = training.OPTIMIZERS["sgd"]().minimize(loss)
    if new_session:
      session.close()
      session = tf.compat.v1.Session()
      session.run(init)
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    with session:
      for _ in range(5):
        session.run(train_op)
      return training.read_variables(session, graph, names)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_session_that_ran_before_the_train_op_raises(layout):
  with pytest.raises(StaleSessionError, match=(
      "ran its graph before the graph's training step was built.*open a "
      "new session after building it")):
    _initialised_before_train_op(layout)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_new_session_after_the_train_op_matches_single_device(layout):
  expected = _initialised_before_train_op(layout, with_epl=False)
  actual = _initialised_before_train_op(layout, new_session=True)
  training.assert_close(actual, expected)


@pytest.mark.timeout(300)
def test_session_run_before_monitored_session_froze_the_graph_raises():
  model = _start("data_parallel", with_epl=True)
  with tf.Graph().as_default():
    x, y = training.input_batch(BATCH)
    loss = tf.reduce_mean(tf.square(model(x) - y))
    early = tf.compat.v1.Session()
    early.run(tf.compat.v1.global_variables_initializer())
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = training.OPTIMIZERS["sgd"]().minimize(loss, global_step=step)
    with tf.compat.v1.train.MonitoredTrainingSession() as monitored:
      monitored.run(train_op)
      assert monitored.run(step) == 1
    with pytest.raises(StaleSessionError, match="open a new session"):
      early.run(loss)
    early.close()
