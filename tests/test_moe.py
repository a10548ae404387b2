"""Expert parallelism: the MoE layer of examples/moe with its experts split
over 2 or 4 devices trains to the weights of the same layer unsplit."""
import numpy as np
import pytest
import tensorflow as tf

import epl
from examples.moe import model as moe
from tests import sharding
from tests import training

DEVICES = 4
LOCAL_BATCH = 4
TOKENS, MODEL, HIDDEN, EXPERTS, CAPACITY = 4, 8, 16, 4, 3


def _batch(batch_size):
  rng = np.random.RandomState(0)
  x = rng.normal(size=(64, TOKENS, MODEL)).astype(np.float32)
  y = rng.normal(size=(64, TOKENS, MODEL)).astype(np.float32)
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
      batch_size, drop_remainder=True)
  return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


def run(split_count=None, optimizer="adam", steps=5, experts=EXPERTS,
        save_to=None, micro_batches=1):
  with_epl = split_count is not None
  if with_epl:
    epl.init(epl.Config({"cluster.num_cpu_devices": DEVICES,
                         "cluster.colocate_split_and_replicate": True,
                         "pipeline.num_micro_batch": micro_batches}))
    epl.set_default_strategy(epl.replicate(DEVICES))
  graph = tf.Graph()
  with graph.as_default():
    x, y = _batch(LOCAL_BATCH // micro_batches if with_epl else
                  LOCAL_BATCH * DEVICES)
    outputs, aux_loss = moe.moe_layer(
        x, experts, HIDDEN, CAPACITY, seed=5,
        split_scope=epl.split(split_count) if with_epl else None)
    loss = tf.reduce_mean(tf.square(outputs - y)) + 0.01 * aux_loss
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
      if with_epl:
        for name in names:
          if name.startswith("experts/"):
            values[name] = sharding.full_variable(
                session, graph, name, DEVICES, split_count, axis=0)
  return values


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


def test_experts_not_dividing_by_shards_is_an_error():
  with pytest.raises(ValueError, match="6 experts.*do.*not divide by the 4"):
    run(4, experts=6, steps=1)


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
