"""Random ops, forward state and variable writes under replicas and
micro-batches."""
import numpy as np
import pytest
import tensorflow as tf

import epl
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
