"""A mixture-of-experts feed-forward layer with top-2 gating (GShard style),
written in plain TF1 graph style.

Inside `epl.split(k)` its expert weights `[E, M, H]` are sharded on E and
the tokens travel to their experts by all-to-all; without EPL (or outside
a split scope) it is the same layer on one device. Gating and dispatch
run outside the split scope, in the data-parallel part.
"""
import contextlib

import tensorflow as tf


def top2_gating(tokens, gate_kernel, capacity):
  """Top-2 gating with a fixed capacity per expert and group.

  tokens [G, S, M] (G groups of S tokens), gate_kernel [M, E]. Returns the
  combine weights [G, S, E, C], the dispatch mask (same shape, 0/1) and
  the auxiliary load-balancing loss. A token's second choice is dropped
  when it would overflow its expert's capacity, as is the first.
  """
  experts = int(gate_kernel.shape[-1])
  probabilities = tf.nn.softmax(
      tf.einsum("GSM,ME->GSE", tokens, gate_kernel), axis=-1)
  first = tf.one_hot(tf.argmax(probabilities, axis=-1), experts)
  second = tf.one_hot(tf.argmax(probabilities * (1.0 - first), axis=-1),
                      experts)
  # Position of each token in its expert's buffer, first choices first.
  first_position = (tf.cumsum(first, axis=1, exclusive=True)) * first
  first = first * tf.cast(first_position < capacity, first.dtype)
  taken = tf.reduce_sum(first, axis=1, keepdims=True)
  second_position = (tf.cumsum(second, axis=1, exclusive=True) +
                     taken) * second
  second = second * tf.cast(second_position < capacity, second.dtype)
  first_gate = tf.reduce_sum(probabilities * first, axis=-1)
  second_gate = tf.reduce_sum(probabilities * second, axis=-1)
  normalizer = first_gate + second_gate + 1e-9
  combine = 0.0
  for gate, mask, position in ((first_gate, first, first_position),
                               (second_gate, second, second_position)):
    slot = tf.one_hot(tf.cast(tf.reduce_sum(position * mask, axis=-1),
                              tf.int32), capacity)
    combine += (tf.expand_dims(tf.expand_dims(gate / normalizer, -1), -1) *
                tf.expand_dims(mask, -1) * tf.expand_dims(slot, 2))
  dispatch = tf.cast(combine > 0.0, tokens.dtype)
  density = tf.reduce_mean(first, axis=1)
  density_proxy = tf.reduce_mean(probabilities, axis=1)
  aux_loss = tf.reduce_mean(density * density_proxy) * float(experts ** 2)
  return combine, dispatch, aux_loss


class Experts(tf.keras.layers.Layer):
  """The experts' two weight tensors, [E, M, H] and [E, H, M]."""

  def __init__(self, num_experts, hidden, seed=None, **kwargs):
    super().__init__(**kwargs)
    self.num_experts = num_experts
    self.hidden = hidden
    self.seed = seed

  def build(self, input_shape):
    model = int(input_shape[-1])
    initializer = tf.keras.initializers.GlorotUniform(seed=self.seed)
    self.inner = self.add_weight(
        "inner", [self.num_experts, model, self.hidden],
        initializer=initializer)
    self.outer = self.add_weight(
        "outer", [self.num_experts, self.hidden, model],
        initializer=tf.keras.initializers.GlorotUniform(
            seed=None if self.seed is None else self.seed + 1))
    super().build(input_shape)

  def call(self, dispatched):
    hidden = tf.nn.relu(tf.einsum("EGCM,EMH->EGCH", dispatched, self.inner))
    return tf.einsum("EGCH,EHM->EGCM", hidden, self.outer)


def moe_layer(tokens, num_experts, hidden, capacity, split_scope=None,
              seed=None):
  """MoE feed-forward over tokens [G, S, M]; returns (outputs, aux_loss).

  `split_scope`: an `epl.split(k)` scope for the experts (None: unsplit).
  """
  gate_kernel = tf.compat.v1.get_variable(
      "gate", [tokens.shape[-1], num_experts],
      initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed))
  combine, dispatch, aux_loss = top2_gating(tokens, gate_kernel, capacity)
  dispatched = tf.einsum("GSEC,GSM->EGCM", dispatch, tokens)
  with split_scope or contextlib.nullcontext():
    experts = Experts(num_experts, hidden, seed=seed, name="experts")
    expert_outputs = experts(dispatched)
    outputs = tf.einsum("GSEC,EGCM->GSM", combine, expert_outputs)
  return outputs, aux_loss
