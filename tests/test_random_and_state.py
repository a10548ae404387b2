"""Random ops, forward state and variable writes under replicas and
micro-batches."""
import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf

import epl
from tests import tolerance
from tests import training

REPLICAS = 2
MICRO_BATCHES = 2
ROWS = 4


def _noise_per_copy(make_noise, config):
  """Runs one step of a model whose loss adds `make_noise()`; returns the
  noise of every copy (replica x micro-batch), in input order."""
  epl.init(epl.Config(config))
  epl.set_default_strategy(epl.replicate(1))
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(1234)
    x, y = training.input_batch(ROWS)
    noise = make_noise()
    epl.add_to_collection(noise, epl.GraphKeys.GLOBAL_CONCAT_OBJECTS)
    prediction = training.layers_model(x) + tf.reduce_mean(noise)
    loss = tf.reduce_mean(tf.square(prediction - y))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      _, noise_value = session.run([train_op, noise])
  epl.shutdown()
  return np.split(noise_value, REPLICAS * MICRO_BATCHES)


CONFIG = {"cluster.num_cpu_devices": REPLICAS,
          "pipeline.num_micro_batch": MICRO_BATCHES}


@pytest.mark.parametrize("make_noise", [
    lambda: tf.nn.dropout(tf.ones([ROWS, 8]), rate=0.5),
    lambda: tf.random.uniform([ROWS, 8]),
    lambda: tf.random.stateless_uniform([ROWS, 8], seed=[3, 4]),
], ids=["dropout", "random_uniform", "stateless"])
def test_every_copy_draws_its_own_numbers_reproducibly(make_noise):
  first = _noise_per_copy(make_noise, CONFIG)
  for a in range(len(first)):
    for b in range(a + 1, len(first)):
      assert not np.array_equal(first[a], first[b]), (a, b)
  again = _noise_per_copy(make_noise, CONFIG)
  for copy, copy_again in zip(first, again):
    np.testing.assert_array_equal(copy, copy_again)


def test_random_generator_is_a_clear_error():
  generator = []

  def make_noise():
    generator.append(tf.random.Generator.from_seed(5))
    return generator[0].uniform([ROWS, 8])
  with pytest.raises(ValueError, match="tf.random.Generator"):
    _noise_per_copy(make_noise, CONFIG)


def test_seeded_random_op_inside_cond_is_a_clear_error():
  def make_noise():
    return tf.cond(tf.constant(True),
                   lambda: tf.random.uniform([ROWS, 8], seed=3),
                   lambda: tf.zeros([ROWS, 8]))
  with pytest.raises(ValueError, match="inside a function"):
    _noise_per_copy(make_noise, CONFIG)


def _batch_norm_model(x, training_mode=True):
  with tf.compat.v1.variable_scope("model", reuse=tf.compat.v1.AUTO_REUSE):
    hidden = tf.compat.v1.layers.dense(
        x, 16, name="hidden",
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
    hidden = tf.compat.v1.layers.batch_normalization(
        hidden, training=training_mode, momentum=0.8, name="norm")
    return tf.compat.v1.layers.dense(
        tf.nn.relu(hidden), 1, name="out",
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))


BN_STEPS = 4


def _bn_values(session, graph):
  names = [v.op.name for v in tf.compat.v1.global_variables()
           if "Momentum" not in v.op.name]
  return training.read_variables(session, graph, names)


def _train_batch_norm(config, micro_batch, fetch_update_ops):
  epl.init(epl.Config(config))
  epl.set_default_strategy(epl.replicate(1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(micro_batch)
    loss = tf.reduce_mean(tf.square(_batch_norm_model(x) - y))
    update_ops = tf.compat.v1.get_collection(
        tf.compat.v1.GraphKeys.UPDATE_OPS)
    optimizer = training.OPTIMIZERS["momentum"]()
    if fetch_update_ops:
      train_op = [optimizer.minimize(loss), update_ops]
    else:
      with tf.control_dependencies(update_ops):
        train_op = optimizer.minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(BN_STEPS):
        session.run(train_op)
      values = _bn_values(session, graph)
      replica = {n: values[n] for n in values if n.startswith("model/norm/")}
      # Replica 1's own copy where it has one (the moving statistics; the
      # trained gamma and beta only with per-replica weights).
      names = {n: training.replica_copies(graph, n, 2)[-1] for n in replica}
      read = training.read_variables(session, graph, list(names.values()))
      copies = {n: read[c] for n, c in names.items()}
  epl.shutdown()
  return values, replica, copies


def _assign_sub(variable, value):
  """variable -= value, for a variable op of either kind."""
  if variable.type == "VarHandleOp":
    return tf.raw_ops.AssignSubVariableOp(resource=variable.outputs[0],
                                          value=value)
  return tf.raw_ops.AssignSub(ref=variable.outputs[0], value=value).op


def _towers_with_mean_update(towers, micro_batch):
  """Plain TF: `towers` towers on consecutive chunks of the global batch,
  sharing variables; the moving statistics move by the mean of the
  towers' own updates (the deltas their AssignMovingAvg ops compute)."""
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(towers * micro_batch)
    losses, deltas = [], {}
    for cx, cy in zip(tf.split(x, towers), tf.split(y, towers)):
      before = set(tf.compat.v1.get_collection(
          tf.compat.v1.GraphKeys.UPDATE_OPS))
      losses.append(tf.reduce_mean(tf.square(_batch_norm_model(cx) - cy)))
      for op in tf.compat.v1.get_collection(
          tf.compat.v1.GraphKeys.UPDATE_OPS):
        if op not in before:
          op = op if isinstance(op, tf.Operation) else op.op
          deltas.setdefault(op.inputs[0].op, []).append(op.inputs[1])
    updates = [_assign_sub(variable, tf.add_n(values) / len(values))
               for variable, values in deltas.items()]
    with tf.control_dependencies(updates):
      train_op = training.OPTIMIZERS["momentum"]().minimize(
          tf.add_n(losses) / towers)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(BN_STEPS):
        session.run(train_op)
      return _bn_values(session, graph)


@pytest.mark.parametrize("fetch_update_ops", [False, True],
                         ids=["control_dependencies", "fetched"])
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_batch_norm_statistics_move_by_the_mean_update(
    fetch_update_ops, micro_batches):
  config = {"cluster.num_cpu_devices": REPLICAS,
            "pipeline.num_micro_batch": micro_batches}
  actual, replica, copies = _train_batch_norm(config, ROWS, fetch_update_ops)
  expected = _towers_with_mean_update(REPLICAS * micro_batches, ROWS)
  training.assert_close(actual, expected)
  for name, value in replica.items():
    np.testing.assert_array_equal(copies[name], value)


def _replica_values(session, graph, name):
  names = training.replica_copies(graph, name, 4)
  values = training.read_variables(session, graph, names)
  return [values[n] for n in names]


@pytest.mark.parametrize("layout", training.WEIGHT_LAYOUTS)
@pytest.mark.parametrize("how", ["load", "assign_op", "keras_set_weights",
                                 "initializer"])
def test_variable_writes_at_any_time_reach_every_replica(how, layout):
  epl.init(epl.Config(dict(training.WEIGHT_LAYOUTS[layout],
                           **{"cluster.num_cpu_devices": 4})))
  epl.set_default_strategy(epl.replicate(1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(ROWS)
    layer = tf.compat.v1.layers.Dense(1, name="dense")
    loss = tf.reduce_mean(tf.square(layer(x) - y))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    kernel = layer.kernel
    new_value = np.full([training.FEATURES, 1], 0.25, np.float32)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)
      if how == "load":
        kernel.load(new_value, session)
      elif how == "assign_op":
        session.run(tf.compat.v1.assign(kernel, new_value))
      elif how == "keras_set_weights":
        tf.compat.v1.keras.backend.set_session(session)
        layer.set_weights([new_value, np.zeros([1], np.float32)])
      else:
        session.run(kernel.initializer)
      values = _replica_values(session, graph, "dense/kernel")
  assert len(values) == (1 if layout == "shared_weights" else 4)
  if how != "initializer":
    np.testing.assert_array_equal(values[0], new_value)
  for value in values[1:]:
    np.testing.assert_array_equal(value, values[0])


def test_lookup_tables_are_shared_by_the_replicas():
  expected_losses = None
  for config in [None, {"cluster.num_cpu_devices": 4}]:
    if config:
      epl.init(epl.Config(config))
      epl.set_default_strategy(epl.replicate(1))
    with tf.Graph().as_default():
      words = tf.data.Dataset.from_tensor_slices(
          tf.constant(["a", "b", "c", "d"] * 8)).repeat().batch(
              ROWS if config else 4 * ROWS)
      tokens = tf.compat.v1.data.make_one_shot_iterator(words).get_next()
      table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
          tf.constant(["a", "b", "c", "d"]),
          tf.constant([0, 1, 2, 3], tf.int64)), default_value=-1)
      embeddings = tf.compat.v1.get_variable(
          "embeddings", [4, 2],
          initializer=tf.compat.v1.constant_initializer(0.5))
      ids = table.lookup(tokens)
      loss = tf.reduce_mean(tf.square(
          tf.nn.embedding_lookup(embeddings, ids) - tf.cast(
              ids[:, None], tf.float32)))
      train_op = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(
          loss)
      with tf.compat.v1.Session() as session:
        session.run([tf.compat.v1.global_variables_initializer(),
                     tf.compat.v1.tables_initializer()])
        for _ in range(3):
          session.run(train_op)
        value = session.run(embeddings)
    epl.shutdown()
    if expected_losses is None:
      expected_losses = value
  tolerance.assert_equivalent(value, expected_losses)


def test_dropped_graphs_are_freed():
  epl.init(epl.Config({"cluster.num_cpu_devices": 2}))
  epl.set_default_strategy(epl.replicate(1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(ROWS)
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)
  dropped = weakref.ref(graph)
  del graph, x, y, loss, train_op, session
  gc.collect()
  assert dropped() is None
