"""Keras 3 under EPL, one scenario per run: `python keras3_scenarios.py
NAME`. tests/test_keras3.py runs it with TF_USE_LEGACY_KERAS=0 or empty (not
unset: .venv-latest sets an unset one to 1), so that tf.keras is Keras 3,
and reads what it prints.

- layers_dp_<N>: Keras 3 Dense layers on a dataset tensor in a TF1 graph,
  trained by tf.compat.v1.train.MomentumOptimizer under epl.replicate on N
  CPU devices, equal to single-device TF on the same global batch.
- eager_loop_dp, eager_loop_accumulation: with eager execution on, an
  eager loop over a `@tf.function` step (GradientTape, a Keras 3 model,
  Keras 3 Adam's apply_gradients) on 4 CPU replicas (with 4 micro-batches
  each) equals the same loop without EPL after 5 steps.
- optimizer_apply, model_fit, train_on_batch, split, v1_layers (in a TF1
  graph), eager_fit, eager_apply (Keras 3 Adam called eagerly, outside a
  tf.function): each raises; the error is printed.
"""
import sys

import numpy as np
import tensorflow as tf

import epl
from tests import training

MICRO = 8
STEPS = 5


def _model(x):
  keras = tf.keras
  hidden = keras.layers.Dense(
      16, activation="tanh", name="hidden",
      kernel_initializer=keras.initializers.GlorotUniform(seed=1))(x)
  return keras.layers.Dense(
      1, name="out",
      kernel_initializer=keras.initializers.GlorotUniform(seed=2))(hidden)


def _train(batch_size, replicas=None):
  """Trains _model; the variables' values by name (with EPL's replica
  copies when `replicas`)."""
  if replicas:
    epl.init(epl.Config({"cluster.num_cpu_devices": replicas}))
    epl.set_default_strategy(epl.replicate(device_count=1))
  else:
    tf.compat.v1.disable_eager_execution()
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(batch_size)
    loss = tf.reduce_mean(tf.square(_model(x) - y))
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(
        loss, global_step=step)
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(STEPS):
        session.run(train_op)
      copies = [op.name for op in graph.get_operations()
                if op.type == "VarHandleOp" and
                op.name.startswith("EPL_REPLICA_") and
                op.name.split("/", 1)[1] in names]
      values = training.read_variables(session, graph, names + copies)
      values["global_step"] = session.run(step)
  if replicas:
    epl.shutdown()
  return values


def layers_dp(replicas):
  expected = _train(replicas * MICRO)
  actual = _train(MICRO, replicas)
  for name, value in actual.items():
    if name.startswith("EPL_REPLICA_"):
      np.testing.assert_array_equal(value, actual[name.split("/", 1)[1]],
                                    err_msg=name)
  users = {k: v for k, v in actual.items() if not k.startswith("EPL_")}
  assert sorted(users) == ["global_step", "hidden/bias", "hidden/kernel",
                           "out/bias", "out/kernel"], sorted(users)
  training.assert_close(users, expected)
  print("KERAS3_LAYERS_OK tf=%s keras=%s replicas=%d copies=%d" % (
      tf.__version__, tf.keras.__version__, replicas,
      len(actual) - len(users)))


def _refused(build, error=RuntimeError):
  epl.init(epl.Config({"cluster.num_cpu_devices": 2}))
  epl.set_default_strategy(epl.replicate(device_count=1))
  with tf.Graph().as_default():
    x, y = training.input_batch(MICRO)
    try:
      build(x, y)
    except error as raised:
      print("KERAS3_ERROR %s" % raised)
      return
  print("KERAS3_NO_ERROR")


def optimizer_apply():
  def build(x, y):
    loss = tf.reduce_mean(tf.square(_model(x) - y))
    variables = tf.compat.v1.trainable_variables()
    tf.keras.optimizers.Adam(0.01).apply_gradients(
        zip(tf.gradients(loss, variables), variables))
  _refused(build)


def _compiled():
  keras = tf.keras
  model = keras.Sequential([keras.Input((training.FEATURES,)),
                            keras.layers.Dense(1)])
  model.compile(optimizer="sgd", loss="mse")
  return model


def model_fit():
  def build(x, y):
    del x, y
    features, labels = training.dataset_arrays()
    _compiled().fit(features, labels, batch_size=MICRO, epochs=1, verbose=0)
  _refused(build)


def train_on_batch():
  def build(x, y):
    del x, y
    features, labels = training.dataset_arrays(rows=MICRO)
    _compiled().train_on_batch(features, labels)
  _refused(build)


def split():
  def build(x, y):
    del y
    with epl.split(device_count=2):
      _model(x)
  _refused(build)


def v1_layers():
  def build(x, y):
    del y
    tf.compat.v1.layers.dense(x, 1)
  _refused(build, AttributeError)


def _eager_model():
  keras = tf.keras
  model = keras.Sequential([keras.Input((training.FEATURES,)),
                            keras.layers.Dense(16, activation="tanh"),
                            keras.layers.Dense(1)])
  rng = np.random.RandomState(1)
  model.set_weights([0.3 * rng.normal(size=w.shape).astype(np.float32)
                     for w in model.get_weights()])
  return model


def _eager_loop():
  """The eager loop of the TF2 tutorials, with Keras 3; the weights after
  5 steps of a global batch of 32 and the last loss."""
  model = _eager_model()
  optimizer = tf.keras.optimizers.Adam(0.01)

  @tf.function
  def train_step(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  features, labels = training.dataset_arrays(rows=STEPS * 32)
  for x, y in tf.data.Dataset.from_tensor_slices((features, labels)).batch(32):
    loss = train_step(x, y)
  return model.get_weights(), float(loss)


def _eager_loop_equals_plain(micro_batches):
  epl.init(epl.Config({"cluster.num_cpu_devices": 4,
                       "pipeline.num_micro_batch": micro_batches}))
  epl.set_default_strategy(epl.replicate(device_count=1))
  weights, loss = _eager_loop()
  epl.shutdown()
  expected_weights, expected_loss = _eager_loop()
  training.assert_close(dict(enumerate(weights)),
                        dict(enumerate(expected_weights)))
  training.assert_close({"loss": loss}, {"loss": expected_loss})
  print("KERAS3_EAGER_LOOP_OK tf=%s keras=%s micro_batches=%d" % (
      tf.__version__, tf.keras.__version__, micro_batches))


def eager_loop_dp():
  _eager_loop_equals_plain(1)


def eager_loop_accumulation():
  _eager_loop_equals_plain(4)


def _eager_refused(run):
  epl.init(epl.Config({"cluster.num_cpu_devices": 2}))
  epl.set_default_strategy(epl.replicate(device_count=1))
  try:
    run()
  except RuntimeError as raised:
    print("KERAS3_ERROR %s" % raised)
    return
  print("KERAS3_NO_ERROR")


def eager_fit():
  def run():
    features, labels = training.dataset_arrays()
    _compiled().fit(features, labels, batch_size=MICRO, epochs=1, verbose=0)
  _eager_refused(run)


def eager_apply():
  def run():
    model = _eager_model()
    zeros = [tf.zeros_like(v) for v in model.trainable_variables]
    tf.keras.optimizers.Adam(0.01).apply_gradients(
        zip(zeros, model.trainable_variables))
  _eager_refused(run)


if __name__ == "__main__":
  scenario = sys.argv[1]
  if scenario.startswith("layers_dp_"):
    layers_dp(int(scenario.rsplit("_", 1)[1]))
  else:
    globals()[scenario]()
