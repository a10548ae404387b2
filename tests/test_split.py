"""epl.split: a sharded dense + softmax cross-entropy head next to a
data-parallel backbone trains to the weights of single-device TF."""
import gc
import logging
import weakref

import numpy as np
import pytest
import tensorflow as tf

import epl
from tests import tolerance
from tests import sharding
from tests import training

DEVICES = 4
# The head of tests/workers/split_worker.py.
CLASSES_FOR_WORKERS = 10
LOCAL_BATCH = 8
STEPS = 5


def _classification_batch(batch_size, classes, static_batch=False):
  """The next batch of features and class labels; with `static_batch`,
  its batch size is part of its static shape (drop_remainder)."""
  rng = np.random.RandomState(0)
  x = rng.normal(size=(256, training.FEATURES)).astype(np.float32)
  labels = np.argmax(x @ rng.normal(size=(training.FEATURES, classes)),
                     axis=1).astype(np.int64)
  dataset = tf.data.Dataset.from_tensor_slices((x, labels)).repeat().batch(
      batch_size, drop_remainder=static_batch)
  return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


# The ways a script builds the head's dense layer.
DENSE_KINDS = {
    "function": lambda hidden, classes, **settings: (
        tf.compat.v1.layers.dense(hidden, classes, **settings)),
    "v1_layer": lambda hidden, classes, **settings: (
        tf.compat.v1.layers.Dense(classes, **settings)(hidden)),
    "keras_layer": lambda hidden, classes, **settings: (
        tf.keras.layers.Dense(classes, **settings)(hidden)),
}


def _head(hidden, labels, classes, loss_kind, dense_kind="function",
          kernel_initializer=None):
  logits = DENSE_KINDS[dense_kind](
      hidden, classes, name="head",
      kernel_initializer=(kernel_initializer or
                          tf.compat.v1.glorot_uniform_initializer(seed=2)),
      bias_initializer=tf.compat.v1.random_normal_initializer(seed=3))
  if loss_kind == "losses":
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  else:
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))
  predictions = tf.argmax(logits, axis=1)
  accuracy = tf.reduce_mean(tf.cast(tf.equal(predictions, labels),
                                    tf.float32))
  return loss, accuracy


def run(classes=10, split_count=None, optimizer="momentum", config=None,
        loss_kind="losses", steps=STEPS, dense_kind="function",
        kernel_initializer=None):
  """Trains the model; returns (variables by name, losses, accuracies).

  With `split_count`, under EPL on DEVICES devices: the backbone is data
  parallel and the head is split; split variables come back as the full
  tensor (the shards of group 0 side by side); their copies in the other
  groups are checked to be equal. Without, plain TF on the global batch.
  """
  with_epl = split_count is not None
  if with_epl:
    settings = {"cluster.num_cpu_devices": DEVICES,
                "cluster.colocate_split_and_replicate": True}
    settings.update(config or {})
    epl.init(epl.Config(settings))
  micro = (config or {}).get("pipeline.num_micro_batch", 1)
  graph = tf.Graph()
  with graph.as_default():
    x, labels = _classification_batch(
        LOCAL_BATCH // micro if with_epl else LOCAL_BATCH * DEVICES, classes)
    if with_epl:
      with epl.replicate(DEVICES):
        hidden = tf.compat.v1.layers.dense(
            x, 16, activation=tf.nn.tanh, name="backbone",
            kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
                seed=1))
      with epl.split(split_count):
        loss, accuracy = _head(hidden, labels, classes, loss_kind,
                               dense_kind, kernel_initializer)
      epl.add_to_collection(accuracy, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
      epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    else:
      hidden = tf.compat.v1.layers.dense(
          x, 16, activation=tf.nn.tanh, name="backbone",
          kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
      loss, accuracy = _head(hidden, labels, classes, loss_kind, dense_kind,
                             kernel_initializer)
    train_op = training.OPTIMIZERS[optimizer]().minimize(loss)
    init = tf.compat.v1.global_variables_initializer()
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    with tf.compat.v1.Session() as session:
      session.run(init)
      losses, accuracies = [], []
      for _ in range(steps):
        _, value, correct = session.run([train_op, loss, accuracy])
        losses.append(value)
        accuracies.append(correct)
      values = training.read_variables(session, graph, names)
      if with_epl:
        values = _full_split_variables(session, graph, values, split_count)
  return values, losses, accuracies


def _full_split_variables(session, graph, values, split_count):
  full = dict(values)
  for name in values:
    if name.startswith("head/"):
      full[name] = sharding.full_variable(session, graph, name, DEVICES,
                                          split_count, axis=-1)
  return full


def _trim(values, classes):
  return {name: value[..., :classes] if name.startswith("head/") else value
          for name, value in values.items()}


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
@pytest.mark.parametrize("classes", [12, 10], ids=["even", "uneven"])
def test_split_head_matches_single_device(optimizer, classes):
  expected, expected_losses, expected_accuracy = run(classes,
                                                     optimizer=optimizer)
  actual, losses, accuracy = run(classes, DEVICES, optimizer=optimizer)
  training.assert_close(_trim(actual, classes), expected)
  tolerance.assert_equivalent(losses, expected_losses)
  np.testing.assert_allclose(accuracy, expected_accuracy)


def test_shards_of_padding_only_with_a_constant_initializer():
  # 5 classes over 4 shards of 2 columns: the last shard holds padding
  # only; the constant initial value is sliced from the padded full one.
  # (Distinct values: equal columns would give the backbone a zero
  # gradient, whose rounding noise Adam would amplify.)
  kernel = np.linspace(-0.5, 0.5, 16 * 5).reshape(16, 5)

  def run_constant(split_count):
    return run(5, split_count, optimizer="adam",
               kernel_initializer=tf.compat.v1.constant_initializer(kernel))
  expected, expected_losses, _ = run_constant(None)
  actual, losses, _ = run_constant(DEVICES)
  training.assert_close(_trim(actual, 5), expected)
  tolerance.assert_equivalent(losses, expected_losses)


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_split_in_two_data_parallel_groups(optimizer):
  # split(2) on 4 devices: replicas 0-1 and 2-3 are two shard groups; the
  # shards' gradients are averaged over the groups, never within one.
  expected, expected_losses, _ = run(10, optimizer=optimizer)
  actual, losses, _ = run(10, 2, optimizer=optimizer)
  training.assert_close(_trim(actual, 10), expected)
  tolerance.assert_equivalent(losses, expected_losses)


@pytest.mark.parametrize("dense_kind", ["v1_layer", "keras_layer"])
def test_split_dense_layer_objects(dense_kind):
  # The Dense classes behind tf.compat.v1.layers.dense, called as objects.
  expected, expected_losses, _ = run(10, dense_kind=dense_kind)
  actual, losses, _ = run(10, DEVICES, dense_kind=dense_kind)
  training.assert_close(_trim(actual, 10), expected)
  tolerance.assert_equivalent(losses, expected_losses)


def test_nn_cross_entropy_returns_the_group_rows():
  expected, expected_losses, _ = run(10, loss_kind="nn")
  actual, losses, _ = run(10, 2, loss_kind="nn")
  training.assert_close(_trim(actual, 10), expected)
  tolerance.assert_equivalent(losses, expected_losses)


@pytest.mark.parametrize("split_count", [4, 2])
def test_split_with_micro_batches(split_count):
  expected, expected_losses, _ = run(10, optimizer="adam")
  actual, losses, _ = run(10, split_count, optimizer="adam",
                          config={"pipeline.num_micro_batch": 2})
  training.assert_close(_trim(actual, 10), expected)
  tolerance.assert_equivalent(losses, expected_losses)


def _predictions(split_count, classes):
  """argmax and top-3 of the head's logits for the first global batch."""
  if split_count:
    epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES,
                         "cluster.colocate_split_and_replicate": True}))
  with tf.Graph().as_default():
    x, labels = _classification_batch(
        LOCAL_BATCH if split_count else LOCAL_BATCH * DEVICES, classes)
    scope = epl.split(split_count) if split_count else None
    if scope:
      epl.set_default_strategy(epl.replicate(DEVICES))
      scope.__enter__()
    logits = tf.compat.v1.layers.dense(
        x, classes, name="head",
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    top = tf.math.top_k(logits, 3)
    argmax = tf.math.argmax(logits, 1, output_type=tf.int32)
    if scope:
      scope.__exit__(None, None, None)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.0).minimize(loss)
    if scope:
      for tensor in (top.values, top.indices, argmax):
        epl.add_to_collection(tensor, epl.GraphKeys.GLOBAL_CONCAT_OBJECTS)
    # Single device: the logits too, to tell near-ties from clear choices.
    fetches = [top.values, top.indices, argmax] + ([] if scope else [logits])
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return session.run([train_op] + fetches)[1:]


@pytest.mark.parametrize("classes", [12, 10])
def test_top_k_and_argmax_match_single_device(classes):
  values, indices, argmax, logits = _predictions(None, classes)
  # One shard group holds the global batch: replica 0's copy has every row
  # (the merged fetch concatenates the DEVICES identical copies).
  actual = _predictions(DEVICES, classes)
  rows = LOCAL_BATCH * DEVICES
  for got in actual:
    assert got.shape[0] == rows * DEVICES
  got_values, got_indices, got_argmax = (got[:rows] for got in actual)
  tolerance.assert_equivalent(got_values, values)
  tolerance.assert_same_ranking(got_indices, indices, logits)
  tolerance.assert_same_ranking(got_argmax, argmax, logits)


def _build_and_run(build_head, split_count=DEVICES, colocate=True):
  """Builds backbone + `build_head(hidden, labels)` (returns the loss) under
  split(split_count) and runs one step."""
  epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES,
                       "cluster.colocate_split_and_replicate": colocate}))
  with tf.Graph().as_default():
    x, labels = _classification_batch(LOCAL_BATCH, 10)
    with epl.replicate(DEVICES):
      hidden = tf.compat.v1.layers.dense(x, 16, name="backbone")
    with epl.split(split_count):
      loss = build_head(hidden, labels)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)


def _dense_and_loss(hidden, labels, **kwargs):
  logits = tf.compat.v1.layers.dense(hidden, 10, name="head", **kwargs)
  return tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)


def _softmax_of_split_logits(hidden, labels):
  logits = tf.compat.v1.layers.dense(hidden, 10, name="head")
  probabilities = tf.nn.softmax(logits)
  return tf.compat.v1.losses.sparse_softmax_cross_entropy(
      labels, logits) + tf.reduce_sum(probabilities)


@pytest.mark.parametrize("build_head, kwargs, message", [
    (_dense_and_loss, dict(split_count=3), "4 devices do not divide into "
     "shard groups of 3"),
    (_dense_and_loss, dict(colocate=False), "colocate_split_and_replicate"),
    (_softmax_of_split_logits, {}, "'Softmax' .*sharded logits 'head/"),
    (lambda h, l: _dense_and_loss(h, l, reuse=True), {},
     "cannot be reused"),
    (lambda h, l: _dense_and_loss(
        h, l, kernel_regularizer=tf.nn.l2_loss), {},
     "kernel_regularizer not supported"),
], ids=["not_dividing", "not_colocated", "unlowered_consumer", "reuse",
        "regularizer"])
def test_split_errors(build_head, kwargs, message):
  with pytest.raises(ValueError, match=message):
    _build_and_run(build_head, **kwargs)


def test_split_is_not_a_default_strategy_and_does_not_nest():
  epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES}))
  with pytest.raises(ValueError, match="expects epl.replicate"):
    epl.set_default_strategy(epl.split(DEVICES))
  with tf.Graph().as_default():
    with epl.replicate(DEVICES):
      with pytest.raises(ValueError, match="nest"):
        with epl.split(DEVICES):
          pass
    with epl.split(DEVICES):
      with pytest.raises(ValueError, match="nest"):
        with epl.replicate(DEVICES):
          pass


def _checkpoint_run(split_count, classes, restore_from=None, save_to=None,
                    steps=2, late_saver=False, config=None):
  """Builds the model (split head when `split_count`, under EPL with
  `config` added), restores or initialises, trains `steps` steps, saves;
  returns the full variables, Momentum slots included."""
  with_epl = split_count is not None
  if with_epl:
    epl.init(epl.Config(dict({"cluster.num_cpu_devices": DEVICES,
                              "cluster.colocate_split_and_replicate": True},
                             **(config or {}))))
  graph = tf.Graph()
  with graph.as_default():
    x, labels = _classification_batch(
        LOCAL_BATCH if with_epl else LOCAL_BATCH * DEVICES, classes)
    scope = epl.split(split_count) if with_epl else None
    if scope:
      epl.set_default_strategy(epl.replicate(DEVICES))
    hidden = tf.compat.v1.layers.dense(x, 16, activation=tf.nn.tanh,
                                       name="backbone")
    if scope:
      scope.__enter__()
    loss, _ = _head(hidden, labels, classes, "losses")
    if scope:
      scope.__exit__(None, None, None)
    train_op = training.OPTIMIZERS["momentum"]().minimize(loss)
    saver = None if late_saver else tf.compat.v1.train.Saver()
    names = [v.op.name for v in tf.compat.v1.global_variables()]
    with tf.compat.v1.Session() as session:
      if restore_from:
        saver.restore(session, restore_from)
      else:
        session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(steps):
        session.run(train_op)
      if save_to:
        # A Saver built after the first run (the rewrite) works as well.
        saver = saver or tf.compat.v1.train.Saver()
        saver.save(session, save_to)
      values = training.read_variables(session, graph, names)
      if with_epl:
        values = _full_split_variables(session, graph, values, split_count)
  return _trim(values, classes)


@pytest.mark.parametrize("classes, late_saver", [(12, False), (10, False),
                                                (10, True)],
                         ids=["even", "uneven", "saver_after_first_run"])
def test_checkpoints_hold_full_tensors_both_ways(tmp_path, classes,
                                                 late_saver):
  # Split run -> checkpoint -> plain TF: the same full variables.
  split_path = str(tmp_path / "split.ckpt")
  trained = _checkpoint_run(2, classes, save_to=split_path,
                            late_saver=late_saver)
  epl.shutdown()
  reader = tf.train.load_checkpoint(split_path)
  assert reader.get_variable_to_shape_map()["head/kernel"] == [16, classes]
  assert reader.get_variable_to_shape_map()["head/kernel/Momentum"] == [
      16, classes]
  restored = _checkpoint_run(None, classes, restore_from=split_path,
                             steps=0)
  training.assert_close(restored, trained, atol=0)
  # Plain TF -> checkpoint -> split run, and both train on alike.
  plain_path = str(tmp_path / "plain.ckpt")
  _checkpoint_run(None, classes, save_to=plain_path)
  expected = _checkpoint_run(None, classes, restore_from=plain_path)
  actual = _checkpoint_run(DEVICES, classes, restore_from=plain_path)
  training.assert_close(actual, expected)


# v3 with every variable large enough to partition: the backbone's weights
# are sharded by ZeRO, the head's by the split.
ZERO_LEVELS = {"v0": {"zero.level": "v0"}, "v1": {"zero.level": "v1"},
               "v2": {"zero.level": "v2"},
               "v3": {"zero.level": "v3", "zero.min_partition_size": 1}}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("level", sorted(ZERO_LEVELS))
def test_split_head_with_zero_matches_single_device(level, caplog):
  # ZeRO partitions the data-parallel backbone; the head's shards (and
  # their slots) are the split's already, each updated by its own replica.
  expected, expected_losses, _ = run(10, optimizer="adam")
  with training.epl_logs_caught(caplog), caplog.at_level(logging.INFO,
                                                         logger="epl"):
    actual, losses, _ = run(10, DEVICES, optimizer="adam",
                            config=ZERO_LEVELS[level])
  training.assert_close(_trim(actual, 10), expected)
  tolerance.assert_equivalent(losses, expected_losses)
  assert [r for r in caplog.records if r.getMessage().startswith(
      "ZeRO %s leaves the split variables head/bias, head/kernel and their "
      "optimizer slots" % level)]


@pytest.mark.timeout(120)
def test_split_with_zero_checkpoints_full_tensors(tmp_path):
  # Plain TF -> checkpoint -> split head with ZeRO v1 trains 2 steps ->
  # checkpoint -> plain TF: the full variables and slots of plain training.
  plain_path = str(tmp_path / "plain.ckpt")
  zero_path = str(tmp_path / "zero.ckpt")
  _checkpoint_run(None, 10, save_to=plain_path)
  expected = _checkpoint_run(None, 10, restore_from=plain_path)
  actual = _checkpoint_run(2, 10, restore_from=plain_path, save_to=zero_path,
                           config={"zero.level": "v1"})
  training.assert_close(actual, expected)
  epl.shutdown()
  restored = _checkpoint_run(None, 10, restore_from=zero_path, steps=0)
  training.assert_close(restored, expected)


def test_unseeded_initial_values_follow_the_unsharded_distribution():
  # Default (unseeded) Glorot: each shard draws its own values with the
  # full layer's fans, and the copies of a shard in the other shard group
  # start equal.
  epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES,
                       "cluster.colocate_split_and_replicate": True}))
  classes, features = 1000, 16
  graph = tf.Graph()
  with graph.as_default():
    x, labels = _classification_batch(LOCAL_BATCH, classes)
    with epl.replicate(DEVICES):
      hidden = tf.compat.v1.layers.dense(x, features, name="backbone")
    with epl.split(2):
      logits = tf.compat.v1.layers.dense(hidden, classes, name="head")
      loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.0).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)
      kernel = sharding.full_variable(session, graph, "head/kernel", DEVICES,
                                      2, axis=-1)
  limit = np.sqrt(6.0 / (features + classes))
  assert kernel.shape == (features, classes)
  assert np.abs(kernel).max() <= limit
  # Uniform on [-limit, limit]: variance limit^2 / 3.
  np.testing.assert_allclose(kernel.var(), limit ** 2 / 3, rtol=0.1)
  assert not np.allclose(kernel[:, :classes // 2], kernel[:, classes // 2:])


def test_fp16_communication_applies_to_the_bridges():
  expected, _, _ = run(10)
  full, _, _ = run(10, DEVICES)
  epl.shutdown()
  half, _, _ = run(10, DEVICES, config={"communication.fp16": True})
  training.assert_close(_trim(half, 10), expected, atol=2e-3)
  # The features went over in float16: not bit-equal to float32 bridges.
  assert any(not np.array_equal(half[name], full[name]) for name in full)


def test_split_with_pipeline_stages_is_not_built():
  epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES,
                       "cluster.colocate_split_and_replicate": True}))
  with tf.Graph().as_default():
    x, labels = _classification_batch(LOCAL_BATCH, 10)
    with epl.replicate(1, name="stage_0"):
      hidden = tf.compat.v1.layers.dense(x, 16, name="backbone")
    with epl.replicate(1, name="stage_1"):
      hidden = tf.compat.v1.layers.dense(hidden, 16, name="middle")
    with epl.split():
      loss = _dense_and_loss(hidden, labels)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session() as session:
      with pytest.raises(NotImplementedError, match="pipeline stages"):
        session.run(train_op)


def _one_split_step(split_count=None):
  """Builds a backbone and a split head, trains one step; the graph."""
  epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES,
                       "cluster.colocate_split_and_replicate": True}))
  graph = tf.Graph()
  with graph.as_default():
    x, labels = _classification_batch(LOCAL_BATCH, 10)
    with epl.replicate(DEVICES):
      hidden = tf.compat.v1.layers.dense(x, 16, name="backbone")
    with epl.split(split_count):
      loss = _dense_and_loss(hidden, labels)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)
  return graph


def test_split_without_a_count_shards_over_every_device():
  graph = _one_split_step()
  # 10 classes over 4 shards: 3 columns each.
  assert graph.get_operation_by_name("EPL_REPLICA_3/head/kernel").get_attr(
      "shape").dim[1].size == 3


def test_plan_of_a_split_model():
  from epl.ir.taskgraph import TaskGraph  # pylint: disable=import-outside-toplevel
  from epl.parallel.plan import planner  # pylint: disable=import-outside-toplevel
  epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES,
                       "cluster.colocate_split_and_replicate": True}))
  env = epl.Env.get()
  plan = planner.make_plan(
      env.cluster, [TaskGraph(0, epl.replicate(DEVICES)),
                    TaskGraph(1, epl.split(2)), TaskGraph(2, epl.split())],
      env.config)
  assert plan.num_replicas == DEVICES
  assert [plan.device(r, 1) for r in range(DEVICES)] == [
      "/device:CPU:%d" % r for r in range(DEVICES)]
  assert plan.split_groups(1) == [[0, 1], [2, 3]]
  assert plan.split_groups(2) == [[0, 1, 2, 3]]
  assert "TaskGraph 1" in plan.describe()


def test_dropped_split_graphs_are_freed():
  # What the split lowerings record lives on the graph, not in a table
  # that would keep every split graph of the process alive.
  dropped = weakref.ref(_one_split_step(DEVICES))
  gc.collect()
  assert dropped() is None
