"""Small models and a training loop used by the equivalence tests.

`train(...)` builds a fresh graph, optionally under EPL, runs a few steps
and returns the trained variables by name, so a parallel run can be
compared with plain single-device TensorFlow on the same global batch.
"""
import contextlib
import functools
import logging
import os
import pathlib
import subprocess
import sys

import numpy as np
import tensorflow as tf

import epl
from tests.tolerance import EQUIVALENCE_TOLERANCE

FEATURES = 8
ROOT = pathlib.Path(__file__).resolve().parent.parent


def dataset_arrays(rows=256, seed=0):
  rng = np.random.RandomState(seed)
  x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
  y = (x @ rng.normal(size=(FEATURES, 1)) +
       0.1 * rng.normal(size=(rows, 1))).astype(np.float32)
  return x, y


def input_batch(batch_size, initializable=False, static_batch=False):
  """The next batch of `dataset_arrays`; with `static_batch`, its batch
  size is part of its static shape, as a script with a fixed batch size
  (drop_remainder) has it."""
  x, y = dataset_arrays()
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
      batch_size, drop_remainder=static_batch)
  if initializable:
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS,
                                   iterator.initializer)
    return iterator.get_next()
  return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


def layers_model(x):
  hidden = tf.compat.v1.layers.dense(
      x, 16, activation=tf.nn.tanh,
      kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
  return tf.compat.v1.layers.dense(
      hidden, 1,
      kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))


def get_variable_model(x):
  w1 = tf.compat.v1.get_variable(
      "w1", [FEATURES, 16],
      initializer=tf.compat.v1.random_normal_initializer(stddev=0.3, seed=3))
  b1 = tf.compat.v1.get_variable("b1", [16],
                                 initializer=tf.compat.v1.zeros_initializer())
  w2 = tf.compat.v1.get_variable(
      "w2", [16, 1],
      initializer=tf.compat.v1.random_normal_initializer(stddev=0.3, seed=4))
  return tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2)


def one_variable_model(x):
  """x W, W [8, 1]: one trained variable, so the optimizer's shared values
  (Adam's beta powers) are read by W's update alone."""
  weight = tf.compat.v1.get_variable(
      "w", [FEATURES, 1],
      initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
  return tf.matmul(x, weight)


def four_equal_layers(x):
  """Four 8x8 weights: a size-balanced partition gives each of 4 replicas
  exactly one."""
  hidden = x
  for index in range(4):
    weight = tf.compat.v1.get_variable(
        "w%d" % index, [FEATURES, FEATURES],
        initializer=tf.compat.v1.random_normal_initializer(
            stddev=0.3, seed=20 + index))
    hidden = tf.nn.tanh(tf.matmul(hidden, weight))
  return tf.reduce_mean(hidden, axis=1, keepdims=True)


def ref_variable_model(x):
  """get_variable_model with TF1 reference variables (VariableV2)."""
  with tf.compat.v1.variable_scope("ref", use_resource=False):
    return get_variable_model(x)


def staged_model(widths=(16, 1), use_scopes=True):
  """A model of len(widths) dense layers (tanh between them), one per
  pipeline stage.

  Under EPL, layer i is built in `epl.replicate(1, name="stage_<i>")`:
  entered as a scope (use_scopes) or set as the default strategy. The last
  stage is left as the default strategy, so that the loss and optimizer
  built after the model join it. Without EPL it is the same plain model.
  """
  def model(x):
    hidden = x
    for index, width in enumerate(widths):
      last = index == len(widths) - 1
      layer = functools.partial(
          tf.compat.v1.layers.dense, units=width,
          activation=None if last else tf.nn.tanh,
          kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
              seed=10 + index), name="layer_%d" % index)
      if not epl.Env.initialised():
        hidden = layer(hidden)
        continue
      stage = epl.replicate(device_count=1, name="stage_%d" % index)
      if use_scopes:
        with stage:
          hidden = layer(hidden)
      else:
        epl.set_default_strategy(stage)
        hidden = layer(hidden)
      if last:
        epl.set_default_strategy(stage)
    return hidden
  return model


def tied_stages(x):
  """Two stages that read one weight W [8, 16] (as BERT's word embeddings
  and its masked-LM output): stage 0 computes tanh(x W), stage 1
  mean(tanh(x W) W^T) over the features; without EPL the same plain
  model."""
  def stage(index):
    if not epl.Env.initialised():
      return contextlib.nullcontext()
    strategy = epl.replicate(device_count=1, name="stage_%d" % index)
    # The last stage stays the default: the loss and optimizer join it.
    epl.set_default_strategy(strategy)
    return strategy
  with stage(0):
    weight = tf.compat.v1.get_variable(
        "w", [FEATURES, 16],
        initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
    hidden = tf.tanh(tf.matmul(x, weight))
  with stage(1):
    back = tf.matmul(hidden, weight, transpose_b=True)
    return tf.reduce_mean(back, axis=1, keepdims=True)


OPTIMIZERS = {
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.05, 0.9),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.01),
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.05),
}


# The two layouts of data-parallel weights on one host's CPUs: one copy
# every replica reads (the default there), and a copy per replica (what
# runs across workers and GPUs), which tests of replica copies ask for.
WEIGHT_LAYOUTS = {
    "shared_weights": {},
    "per_replica_weights": {"communication.shared_weights": False},
}
PER_REPLICA_WEIGHTS = WEIGHT_LAYOUTS["per_replica_weights"]


def replica_copies(graph, name, replicas):
  """Every replica's copy of variable `name`: [name] then the other
  replicas' own copies, where they have any (not with shared weights)."""
  copies = ["EPL_REPLICA_%d/%s" % (r, name) for r in range(1, replicas)]
  existing = {op.name for op in graph.get_operations()}
  return [name] + [c for c in copies if c in existing]


def read_variables(session, graph, names):
  """Values of the variables `names` (op names) in `graph`, even replicas'."""
  reads = {}
  with graph.as_default():
    for name in names:
      op = graph.get_operation_by_name(name)
      if op.type == "VarHandleOp":
        reads[name] = tf.raw_ops.ReadVariableOp(resource=op.outputs[0],
                                                dtype=op.get_attr("dtype"))
      else:
        reads[name] = op.outputs[0]
  return session.run(reads)


def run_steps(graph, fetches, steps):
  """Initialises `graph`'s variables, runs `fetches` `steps` times in one
  session; returns the trainable variables' values by name."""
  with graph.as_default():
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(steps):
        session.run(fetches)
      return read_variables(session, graph, names)


def clipped_training(make_optimizer, batch_size, steps=5, clip_norm=0.1):
  """Trains layers_model `steps` steps with `make_optimizer()`, clipping the
  gradients to `clip_norm` global norm between compute_gradients and
  apply_gradients; returns the trainable variables' values by name."""
  return processed_training(
      make_optimizer, batch_size,
      lambda grads: tf.clip_by_global_norm(grads, clip_norm)[0], steps)


def processed_training(make_optimizer, batch_size, process, steps=5):
  """Trains layers_model `steps` steps with `make_optimizer()`, applying
  `process(gradients)` (the list compute_gradients made, in order) instead
  of the gradients; returns the trainable variables' values by name."""
  graph = tf.Graph()
  with graph.as_default():
    x, y = input_batch(batch_size)
    loss = tf.reduce_mean(tf.square(layers_model(x) - y))
    optimizer = make_optimizer()
    grads, variables = zip(*optimizer.compute_gradients(loss))
    train_op = optimizer.apply_gradients(zip(process(list(grads)), variables))
  return run_steps(graph, train_op, steps)


def train(model=layers_model, optimizer="momentum", steps=5, batch_size=16,
          config=None, loss_scale=1.0, with_epl=True, global_step=True,
          default_strategy=True):
  """Trains `steps` steps; returns (trainable values by name, losses, graph,
  replica-variable reader). With `default_strategy` False, EPL starts
  without one (the model sets its own stages: `staged_model`)."""
  if with_epl:
    epl.init(epl.Config(config or {}))
    if default_strategy:
      epl.set_default_strategy(epl.replicate(device_count=1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = input_batch(batch_size)
    loss = tf.reduce_mean(tf.square(model(x) - y)) * loss_scale
    step = tf.compat.v1.train.get_or_create_global_step() if global_step \
        else None
    train_op = OPTIMIZERS[optimizer]().minimize(loss, global_step=step)
    init = tf.compat.v1.global_variables_initializer()
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    with tf.compat.v1.Session() as session:
      session.run(init)
      losses = [session.run([train_op, loss])[1] for _ in range(steps)]
      values = read_variables(session, graph, names)
      if global_step:
        values["global_step"] = session.run(step)
  return values, losses, graph


def train_fed(config=None, optimizer="momentum", rows=16, steps=4):
  """Trains layers_model `steps` steps on batches of `rows` rows fed
  through placeholders (`[None, ...]`; its first layer's MatMul reads one
  directly), with EPL and `config` unless it is None; checks every step
  that the copies together read the fed rows (a fixed-shape placeholder,
  a loss weight, is read whole); returns the trainable values by name
  and the graph."""
  if config is not None:
    epl.init(epl.Config(config))
    epl.set_default_strategy(epl.replicate(1))
  features, targets = dataset_arrays()
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None, FEATURES])
    y = tf.compat.v1.placeholder(tf.float32, [None, 1])
    loss_weight = tf.compat.v1.placeholder(tf.float32, [])
    loss = tf.reduce_mean(tf.square(layers_model(x) - y)) * loss_weight
    # Rows each copy trains on, summed over the copies: the fed batch.
    rows_seen = tf.shape(x)[0] + 0
    if config is not None:
      epl.add_to_collection(rows_seen, epl.GraphKeys.GLOBAL_SUM_OBJECTS)
    train_op = OPTIMIZERS[optimizer]().minimize(loss)
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for step in range(steps):
        rows_of_step = slice(step * rows, (step + 1) * rows)
        _, seen = session.run([train_op, rows_seen], {
            x: features[rows_of_step], y: targets[rows_of_step],
            loss_weight: 1.0})
        assert seen == rows, (seen, rows)
      values = read_variables(session, graph, names)
  epl.shutdown()
  return values, graph


def assert_close(actual, expected, atol=EQUIVALENCE_TOLERANCE["atol"]):
  """Dicts of arrays with the same names, each within `atol` (the policy's
  by default; looser for half precision, 0 for bit-exact restores)."""
  assert sorted(actual) == sorted(expected)
  for name in expected:
    np.testing.assert_allclose(actual[name], expected[name], atol=atol,
                               rtol=EQUIVALENCE_TOLERANCE["rtol"],
                               err_msg=name)


def gradient_pairs(optimizer, loss, use_tf_gradients):
  """(gradient, variable) pairs from tf.gradients or compute_gradients."""
  if use_tf_gradients:
    variables = tf.compat.v1.trainable_variables()
    return list(zip(tf.gradients(loss, variables), variables))
  return optimizer.compute_gradients(loss)


def reference_variable_training(batch_size, use_tf_gradients, config=None):
  """ref_variable_model trained by Adam from tf.gradients (ungated) or
  compute_gradients (GATE_OP); returns (weights, graph)."""
  if config:
    epl.init(epl.Config(config))
    epl.set_default_strategy(epl.replicate(device_count=1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = input_batch(batch_size)
    loss = tf.reduce_mean(tf.square(ref_variable_model(x) - y))
    optimizer = OPTIMIZERS["adam"]()
    train_op = optimizer.apply_gradients(
        gradient_pairs(optimizer, loss, use_tf_gradients))
  return run_steps(graph, train_op, 5), graph


@contextlib.contextmanager
def epl_logs_caught(caplog):
  """EPL's log records reach `caplog`, also from a first epl.init (which
  stops the logger propagating)."""
  logger = logging.getLogger("epl")
  logger.addHandler(caplog.handler)
  try:
    yield
  finally:
    logger.removeHandler(caplog.handler)


def run_client(script, *arguments, timeout=240, **environment):
  """What `python <script> <arguments>` prints, then logs, in a fresh process
  with this checkout first on the path; fails the test, showing its
  output, when it exits with an error or runs over `timeout` seconds.
  For scripts that need a TensorFlow state this process cannot have
  (eager execution, once the conftest switched it off)."""
  env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3",
             **environment)
  result = subprocess.run([sys.executable, str(ROOT / script), *arguments],
                          capture_output=True, text=True, timeout=timeout,
                          check=False, env=env, cwd=str(ROOT))
  assert result.returncode == 0, result.stdout + result.stderr[-5000:]
  return result.stdout + result.stderr
