"""Gradient buckets in ready order, dealt to several communicators."""
import numpy as np
import pytest
import tensorflow as tf

import epl
from epl.ir import graph_editor
from epl.parallel.passes import gradient_buckets
from tests import training

REPLICAS = 4
MICRO = 8
WIDTHS = (16, 12, 8, 1)


def deep_model(x):
  """Four dense layers: four kernels and biases, so several buckets."""
  hidden = x
  for index, width in enumerate(WIDTHS):
    hidden = tf.compat.v1.layers.dense(
        hidden, width, activation=tf.nn.tanh if index < len(WIDTHS) - 1
        else None, name="layer_%d" % index,
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
            seed=20 + index))
  return hidden


def train_with_replicas(config=None, steps=5, loss_scale=1.0):
  """Trains deep_model under EPL on REPLICAS devices; returns ({variable:
  value} of replica 0, [the same for every other replica], graph)."""
  settings = {"cluster.num_cpu_devices": REPLICAS}
  settings.update(config or {})
  epl.init(epl.Config(settings))
  epl.set_default_strategy(epl.replicate(device_count=1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(MICRO)
    loss = tf.reduce_mean(tf.square(deep_model(x) - y)) * loss_scale
    train_op = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss)
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(steps):
        session.run(train_op)
      copies = {n: training.replica_copies(graph, n, REPLICAS)
                for n in names}
      values = training.read_variables(
          session, graph, [c for n in names for c in copies[n]])
  replica_zero = {n: values[n] for n in names}
  # What each other replica reads: its own copy, or replica 0's (shared
  # weights).
  others = [{n: values[copies[n][r] if len(copies[n]) > r else n]
             for n in names} for r in range(1, REPLICAS)]
  return replica_zero, others, graph


def single_device(loss_scale=1.0):
  return training.train(deep_model, "momentum", batch_size=REPLICAS * MICRO,
                        loss_scale=loss_scale, global_step=False,
                        with_epl=False)[0]


def _assert_identical(first, second):
  assert sorted(first) == sorted(second)
  for name in first:
    np.testing.assert_array_equal(first[name], second[name], err_msg=name)


def _group_key(op):
  return int(tf.get_static_value(op.inputs[2]))


def _instance_key(op):
  return int(tf.get_static_value(op.inputs[3]))


def _local_sums(graph):
  return [op for op in graph.get_operations()
          if op.type == "AddN" and
          op.name.startswith("EPL_GRADIENT_AGGREGATION")]


def _gradient_all_reduces(graph):
  return [op for op in graph.get_operations()
          if op.type == "CollectiveReduceV2" and
          op.name.startswith("EPL_GRADIENT_AGGREGATION")]


RING = {"communication.local_cpu_reduce": False}


@pytest.mark.parametrize("config,atol", [
    (RING, 1e-5),
    (dict(RING, **{"communication.fp16": True}), 2e-3),
    # float16 overflows at this scale: every replica sends the buckets
    # again as float32, so training stays exact.
    (dict(RING, **{"communication.fp16": True,
                   "communication.fp16_scale": 1e9}), 1e-5),
    ({}, 1e-5),
    ({"communication.fp16": True, "communication.fp16_scale": 1e9}, 1e-5),
], ids=["float32", "fp16", "fp16_overflow", "local_float32",
        "local_fp16_overflow"])
def test_communicator_counts_give_identical_weights(config, atol):
  expected = single_device()
  ring = config.get("communication.local_cpu_reduce") is False
  results = []
  for count in range(1, 5):
    # Small buckets: five of them, more than the communicators.
    settings = dict(config, **{"communication.num_communicators": count,
                               "communication.max_splits": 32})
    weights, others, graph = train_with_replicas(settings)
    groups = {_group_key(op) for op in _gradient_all_reduces(graph)}
    if ring:
      assert len(groups) == count
    else:
      # One sum per gradient (not fused) on one replica's device, read by
      # every replica.
      assert len(_local_sums(graph)) == 2 * len(WIDTHS)
    for replica in others:
      _assert_identical(replica, weights)
    training.assert_close(weights, expected, atol=atol)
    results.append(weights)
  for weights in results[1:]:
    _assert_identical(weights, results[0])


def test_buckets_start_with_the_last_layer_and_chain_per_group():
  _, _, graph = train_with_replicas(
      {"communication.local_cpu_reduce": False,
       "communication.num_communicators": 2,
       "communication.max_splits": 8}, steps=1)
  replica_zero = [op for op in _gradient_all_reduces(graph)
                  if op.device.endswith("CPU:0")]
  by_group = {}
  for op in replica_zero:
    by_group.setdefault(_group_key(op), []).append(op)
  assert len(by_group) == 2
  for ops in by_group.values():
    # Ordered within a group: each waits on the one before; free across.
    others = {o.name for group in by_group.values() if group is not ops
              for o in group}
    for previous, current in zip(ops, ops[1:]):
      before = {o.name for o in graph_editor.ancestors([current])}
      assert previous.name in before
      assert not before & others
  layers_in_start_order = []
  for op in sorted(replica_zero, key=_instance_key):
    # The variables whose updates read this all-reduce's result.
    reached = graph_editor.reachable(
        [op], lambda o: [c for t in o.outputs for c in t.consumers()])
    layers_in_start_order.append(sorted(
        {o.inputs[0].op.name.split("/")[0] for o in reached
         if o.type == "ResourceApplyMomentum"}, reverse=True))
  assert layers_in_start_order[0][0] == "layer_3", layers_in_start_order
  flat = [layer for bucket in layers_in_start_order for layer in bucket]
  assert flat == sorted(flat, reverse=True), layers_in_start_order


def test_ready_order_follows_the_graph_not_names_or_creation():
  graph = tf.Graph()
  with graph.as_default():
    x = tf.ones([2, 3])
    variables = [tf.compat.v1.get_variable("v%d" % i, [3, 3])
                 for i in range(3)]
    hidden = x
    for variable in variables:
      hidden = tf.tanh(tf.matmul(hidden, variable))
    grads = tf.gradients(tf.reduce_sum(hidden), variables)
    ordered, _ = gradient_buckets.ready_order([grads[1], grads[0],
                                               grads[2]])
  assert [g.name for g in ordered] == [g.name for g in reversed(grads)]
