"""Expert parallelism: the MoE layer of examples/moe with its experts split
over 2 or 4 devices trains to the weights of the same layer unsplit."""
import contextlib

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.layers import base as tf1_layers_base

import epl
from examples.moe import model as moe
from tests import sharding
from tests import training

DEVICES = 4
LOCAL_BATCH = 4
TOKENS, MODEL, HIDDEN, EXPERTS, CAPACITY = 4, 8, 16, 4, 3
GROUPS = 2


def _batch(batch_size):
  rng = np.random.RandomState(0)
  x = rng.normal(size=(64, TOKENS, MODEL)).astype(np.float32)
  y = rng.normal(size=(64, TOKENS, MODEL)).astype(np.float32)
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
      batch_size, drop_remainder=True)
  return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


def run(split_count=None, optimizer="adam", steps=5, experts=EXPERTS,
        save_to=None, micro_batches=1, config=None):
  """Trains the MoE layer (its experts split over `split_count` devices,
  under EPL with `config` added); returns the trained variables by name."""
  with_epl = split_count is not None
  if with_epl:
    epl.init(epl.Config(dict({"cluster.num_cpu_devices": DEVICES,
                              "cluster.colocate_split_and_replicate": True,
                              "pipeline.num_micro_batch": micro_batches},
                             **(config or {}))))
    epl.set_default_strategy(epl.replicate(DEVICES))
  graph = tf.Graph()
  with graph.as_default():
    x, y = _batch(LOCAL_BATCH // micro_batches if with_epl else
                  LOCAL_BATCH * DEVICES)
    outputs, aux_loss = moe.moe_layer(
        x, experts, HIDDEN, CAPACITY, seed=5,
        split_scope=epl.split(split_count) if with_epl else None)
    loss = tf.reduce_mean(tf.square(outputs - y)) + 0.01 * aux_loss
    return _train(graph, loss, optimizer, steps, split_count, save_to)


def _train(graph, loss, optimizer, steps, split_count, save_to=None):
  """Trains `loss` of `graph` `steps` steps; returns the trained variables
  by name, the experts' whole (their shards put together when split over
  `split_count` devices)."""
  with graph.as_default():
    train_op = training.OPTIMIZERS[optimizer]().minimize(loss)
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(steps):
        session.run(train_op)
      if save_to:
        saver.save(session, save_to)
      values = training.read_variables(session, graph, names)
      if split_count is not None:
        for name in names:
          if name.startswith("experts/"):
            values[name] = sharding.full_variable(
                session, graph, name, DEVICES, split_count, axis=0)
  return values


def run_experts_known_at_run_time(split_count=None, experts=EXPERTS,
                                  rows=EXPERTS, steps=3):
  """Trains the experts of the MoE layer on tokens already dispatched
  ([E, G, C, M]) and weighted back by combine weights ([E, G, S, C]), both
  read `rows` expert rows at a time from a dataset: the experts axis is
  the dataset's batch dimension, unknown when the graph is built (the
  original EPL's tests feed their experts so). Under EPL each of the
  DEVICES replicas reads its own rows; without, one device reads those of
  every replica, side by side on the groups axis."""
  with_epl = split_count is not None
  if with_epl:
    epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES,
                         "cluster.colocate_split_and_replicate": True}))
    epl.set_default_strategy(epl.replicate(DEVICES))
  rng = np.random.RandomState(1)
  tokens = rng.normal(size=(64, GROUPS, CAPACITY, MODEL)).astype(np.float32)
  combine = rng.uniform(size=(64, GROUPS, TOKENS, CAPACITY)).astype(
      np.float32)
  targets = rng.normal(size=(16, GROUPS, TOKENS, MODEL)).astype(np.float32)
  graph = tf.Graph()
  with graph.as_default():
    data = tf.data.Dataset.zip((
        tf.data.Dataset.from_tensor_slices((tokens, combine)).repeat().batch(
            rows),
        tf.data.Dataset.from_tensor_slices(targets).repeat()))
    if not with_epl:
      data = data.batch(DEVICES)
    (x, weights), y = tf.compat.v1.data.make_one_shot_iterator(
        data).get_next()
    if not with_epl:
      x, weights = [tf.reshape(tf.transpose(t, [1, 0, 2, 3, 4]),
                               [-1, DEVICES * GROUPS] + t.shape[3:].as_list())
                    for t in (x, weights)]
      y = tf.reshape(y, [DEVICES * GROUPS, TOKENS, MODEL])
    assert tf.compat.dimension_value(x.shape[0]) is None
    assert tf.compat.dimension_value(weights.shape[0]) is None
    with epl.split(split_count) if with_epl else contextlib.nullcontext():
      expert_outputs = moe.Experts(experts, HIDDEN, seed=5,
                                   name="experts")(x)
      outputs = tf.einsum("GSEC,EGCM->GSM",
                          tf.transpose(weights, [1, 2, 0, 3]), expert_outputs)
    loss = tf.reduce_mean(tf.square(outputs - y))
    return _train(graph, loss, "adam", steps, split_count)


@pytest.mark.parametrize("split_count", [4, 2])
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_split_experts_match_unsplit_layer(split_count, optimizer):
  expected = run(optimizer=optimizer)
  actual = run(split_count, optimizer=optimizer)
  assert actual["experts/inner"].shape == (EXPERTS, MODEL, HIDDEN)
  training.assert_close(actual, expected)


def test_split_experts_with_micro_batches():
  # Groups are examples, so 2 micro-batches of 2 examples see the same
  # groups as one batch of 4.
  expected = run()
  actual = run(2, micro_batches=2)
  training.assert_close(actual, expected)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("zero", [{"zero.level": "v1"},
                                  {"zero.level": "v3",
                                   "zero.min_partition_size": 1}],
                         ids=["v1", "v3"])
def test_split_experts_with_zero(zero):
  # ZeRO partitions the replicated gate; the experts are the split's.
  expected = run()
  actual = run(DEVICES, config=zero)
  training.assert_close(actual, expected)


def test_experts_not_dividing_by_shards_is_an_error():
  with pytest.raises(ValueError, match="6 experts.*do.*not divide by the 4"):
    run(4, experts=6, steps=1)


@pytest.mark.parametrize("split_count", [4, 2])
def test_experts_axis_known_only_at_run_time(split_count):
  expected = run_experts_known_at_run_time()
  actual = run_experts_known_at_run_time(split_count)
  assert actual["experts/inner"].shape == (EXPERTS, MODEL, HIDDEN)
  training.assert_close(actual, expected)


@pytest.mark.usefixtures("tf1_tensor_shapes")
def test_experts_axis_known_only_at_run_time_with_tf1_tensor_shapes():
  # The unknown experts axis is Dimension(None) (disable_v2_behavior).
  expected = run_experts_known_at_run_time()
  actual = run_experts_known_at_run_time(2)
  training.assert_close(actual, expected)


def test_experts_axis_of_the_wrong_size_at_run_time_is_an_error():
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"EGCM,EMH->EGCH.*must hold all 4 experts \(2 "
                     r"shards of 2"):
    run_experts_known_at_run_time(2, rows=6, steps=1)


def test_unknown_einsum_under_split_is_an_error():
  epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES,
                       "cluster.colocate_split_and_replicate": True}))
  with tf.Graph().as_default():
    with epl.split(DEVICES):
      x = tf.zeros([2, 3])
      with pytest.raises(ValueError, match="'ij,jk->ik'.*fits no sharded"):
        tf.einsum("ij,jk->ik", x, tf.zeros([3, 2]))


def test_checkpoint_holds_every_expert(tmp_path):
  path = str(tmp_path / "moe.ckpt")
  trained = run(2, steps=2, save_to=path)
  reader = tf.train.load_checkpoint(path)
  for name in ("experts/inner", "experts/outer", "experts/inner/Adam"):
    assert reader.get_variable_to_shape_map()[name][0] == EXPERTS
  np.testing.assert_array_equal(reader.get_tensor("experts/inner"),
                                trained["experts/inner"])


def test_unseeded_keras_glorot_experts_draw_their_shard_alone():
  epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES,
                       "cluster.colocate_split_and_replicate": True}))
  graph = tf.Graph()
  with graph.as_default():
    with epl.split(DEVICES):
      experts = moe.Experts(8, 64, name="experts")
      experts.build([None, None, None, 32])
    names = [v.op.name for v in experts.weights]
  # No op builds the full [8, 32, 64] value: each shard draws [2, 32, 64].
  shapes = [op.outputs[0].shape.as_list() for op in graph.get_operations()
            if op.type == "RandomUniform"]
  assert shapes == [[2, 32, 64], [2, 64, 32]], (shapes, names)


class _TF1Experts(tf1_layers_base.Layer):
  """Experts written as TF1 code writes layers (the original EPL's tests
  do): on tensorflow.python.layers.base.Layer, TensorFlow's frozen Keras."""

  def build(self, input_shape):
    self.inner = self.add_weight("inner", [EXPERTS, MODEL, HIDDEN])
    super().build(input_shape)

  def call(self, dispatched):
    return tf.einsum("EGCM,EMH->EGCH", dispatched, self.inner)


def test_weights_of_a_tf1_layer_are_sharded():
  epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES,
                       "cluster.colocate_split_and_replicate": True}))
  with tf.Graph().as_default():
    with epl.split(2):
      layer = _TF1Experts(name="experts")
      hidden = layer(tf.ones([EXPERTS, 1, CAPACITY, MODEL]))
  assert layer.inner.shape.as_list() == [EXPERTS // 2, MODEL, HIDDEN]
  # The tokens of the 2 shards' experts were exchanged: [E / 2, G, 2C, H].
  assert hidden.shape.as_list() == [EXPERTS // 2, 1, 2 * CAPACITY, HIDDEN]
