"""A client script in the original EPL's published idioms (FastNN BERT):
Google BERT's optimizer shape and training step, written here from scratch.

- `AdamWeightDecay` overrides `apply_gradients` without calling the base
  class, makes its slots with `get_variable` and never touches
  `global_step`;
- the step is `tf.gradients` -> `clip_by_global_norm` ->
  `apply_gradients(...)` -> `tf.group(train_op, global_step.assign(gs + 1))`
  with a warmed-up, linearly decayed learning rate read from `global_step`;
- the embedding table is built before the first `set_default_strategy`,
  and pipeline stages are made by switching the default strategy.
"""
import tensorflow as tf

import epl
from tests import training

VOCAB = 32
WIDTH = 16


class AdamWeightDecay(tf.compat.v1.train.Optimizer):
  """Adam with decoupled weight decay, applied without the base class."""

  def __init__(self, learning_rate, weight_decay_rate=0.01, beta_1=0.9,
               beta_2=0.999, epsilon=1e-6, name="AdamWeightDecay"):
    super().__init__(False, name)
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    assignments = []
    for grad, param in grads_and_vars:
      if grad is None:
        continue
      base = param.op.name
      m = tf.compat.v1.get_variable(
          base + "/adam_m", shape=param.shape, dtype=tf.float32,
          trainable=False, initializer=tf.compat.v1.zeros_initializer())
      v = tf.compat.v1.get_variable(
          base + "/adam_v", shape=param.shape, dtype=tf.float32,
          trainable=False, initializer=tf.compat.v1.zeros_initializer())
      # tf.multiply converts an IndexedSlices gradient (the embedding's)
      # to a dense tensor, as BERT's optimizer relies on.
      next_m = tf.multiply(self.beta_1, m) + tf.multiply(1.0 - self.beta_1,
                                                         grad)
      next_v = tf.multiply(self.beta_2, v) + tf.multiply(
          1.0 - self.beta_2, tf.square(grad))
      update = next_m / (tf.sqrt(next_v) + self.epsilon)
      update += self.weight_decay_rate * param
      assignments += [param.assign(param - self.learning_rate * update),
                      m.assign(next_m), v.assign(next_v)]
    return tf.group(*assignments, name=name)


def learning_rate(global_step, init_lr=0.05, warmup=2, total=10):
  step = tf.cast(global_step, tf.float32)
  decayed = tf.compat.v1.train.polynomial_decay(
      tf.constant(init_lr), global_step, total, end_learning_rate=0.0)
  warm = init_lr * step / warmup
  return tf.where(step < warmup, warm, decayed)


def _dense(x, units, name, activation=None):
  return tf.compat.v1.layers.dense(
      x, units, activation=activation, name=name,
      kernel_initializer=tf.compat.v1.truncated_normal_initializer(
          stddev=0.3, seed=len(name)))


def build(stages=1, clip_norm=0.05, micro_batch=8):
  """Builds the BERT-like model and step; returns (train_op, loss).

  With EPL and `stages` > 1 the blocks go to stages by switching the
  default strategy; with one stage a single replicate default is set
  after the embedding (which, built before it, joins the first TaskGraph).
  """
  x, y = training.input_batch(micro_batch)
  ids = tf.math.floormod(tf.cast(tf.abs(x[:, :4]) * 10.0, tf.int32), VOCAB)
  table = tf.compat.v1.get_variable(
      "embeddings", [VOCAB, WIDTH],
      initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.3,
                                                            seed=7))
  hidden = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1)
  hidden = tf.concat([hidden, x], axis=1)
  for block in range(2):
    if epl.Env.initialised():
      epl.set_default_strategy(epl.replicate(
          1, name="stage_%d" % (block * stages // 2)))
    hidden = _dense(hidden, WIDTH, "block_%d/ffn" % block, tf.nn.tanh)
    hidden = _dense(hidden, WIDTH, "block_%d/out" % block) + hidden
  loss = tf.reduce_mean(tf.square(_dense(hidden, 1, "head") - y))

  global_step = tf.compat.v1.train.get_or_create_global_step()
  optimizer = AdamWeightDecay(learning_rate(global_step))
  tvars = tf.compat.v1.trainable_variables()
  grads = tf.gradients(loss, tvars)
  grads, _ = tf.clip_by_global_norm(grads, clip_norm=clip_norm)
  train_op = optimizer.apply_gradients(zip(grads, tvars),
                                       global_step=global_step)
  if epl.Env.initialised():
    train_op = tf.group(train_op, [global_step.assign(global_step + 1)])
  else:
    # The plain-TF reference: as written, TF leaves the learning rate's read
    # of global_step and the increment unordered (a race such scripts live
    # with, that made references differ between runs); EPL runs the
    # increment after every read, so the reference orders it the same way.
    with tf.control_dependencies([train_op]):
      train_op = tf.group(train_op, [global_step.assign(global_step + 1)])
  return train_op, loss
