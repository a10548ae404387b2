"""epl.ir.variables finds a variable's initializer and its optimizer slots
by TensorFlow's structure (the tf.Variable's `initializer`, the optimizer's
`get_slot`), whatever the ops are named."""
import tensorflow as tf

import epl
from epl.ir import variables


def _adam_step(use_resource):
  """A variable named like another's slot scope, trained by Adam under a
  user scope; returns (graph, weight, decoy, optimizer)."""
  epl.init(epl.Config({"cluster.num_cpu_devices": 1}))
  graph = tf.Graph()
  with graph.as_default(), epl.replicate(1):
    weight = tf.compat.v1.get_variable(
        "w", [3], use_resource=use_resource,
        initializer=tf.compat.v1.ones_initializer())
    # Named as if it were a slot of `w`: only structure tells it is not.
    decoy = tf.compat.v1.get_variable(
        "w/Adam_9", [3], use_resource=use_resource, trainable=False,
        initializer=tf.compat.v1.zeros_initializer())
    loss = tf.reduce_sum(tf.square(weight))
    optimizer = tf.compat.v1.train.AdamOptimizer(0.1)
    with tf.name_scope("user"):
      optimizer.minimize(loss)
  return graph, weight, decoy, optimizer


def test_initializer_is_the_variables_own_write():
  for use_resource in (False, True):
    _, weight, decoy, _ = _adam_step(use_resource)
    assert variables.initializer(variables.op_of(weight)) is (
        weight.initializer)
    assert variables.initializer(variables.op_of(decoy)) is decoy.initializer


def test_slots_are_what_the_optimizer_holds():
  for use_resource in (False, True):
    _, weight, decoy, optimizer = _adam_step(use_resource)
    weight_op = variables.op_of(weight)
    for name in optimizer.get_slot_names():
      slot = variables.op_of(optimizer.get_slot(weight, name))
      assert variables.slot_owner(slot) is weight_op
    assert variables.slot_owner(variables.op_of(decoy)) is None
    assert variables.slot_owner(weight_op) is None
