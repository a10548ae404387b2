"""epl.profiler: measured memory per device as a SessionRunHook; static
FLOPs, bytes and per-TaskGraph costs; the FLOPs hook."""
import csv
import logging
import os

import pytest
import tensorflow as tf

import epl
from epl.parallel.cost import flops
from epl.ir import graph_editor
from epl.tools.memory_profiler_hook import MemoryProfilerHook
from tests import training

WIDTH = 128


@pytest.mark.parametrize("layout", training.WEIGHT_LAYOUTS)
def test_memory_profiler_hook_under_data_parallelism(tmp_path, layout):
  epl.init(epl.Config(dict(training.WEIGHT_LAYOUTS[layout],
                           **{"cluster.num_cpu_devices": 2})))
  epl.set_default_strategy(epl.replicate(device_count=1))
  hook = MemoryProfilerHook(save_steps=2, max_steps=4,
                            output_dir=str(tmp_path), dump_metadata=True)
  with tf.Graph().as_default():
    x, _ = training.input_batch(32)
    hidden = x
    for _ in range(3):
      hidden = tf.compat.v1.layers.dense(hidden, WIDTH, tf.nn.relu)
    loss = tf.reduce_mean(hidden)
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(
        loss, global_step=step)
    with tf.compat.v1.train.MonitoredTrainingSession(
        hooks=[hook, tf.compat.v1.train.StopAtStepHook(last_step=5)]) as sess:
      while not sess.should_stop():
        sess.run(train_op)
  assert sorted(hook.results) == [2, 4]
  assert sorted(os.listdir(tmp_path)) == sorted(
      ["run_metadata_2.bin", "run_metadata_4.bin"] +
      ["step_%d_memory%s" % (n, ext) for n in (2, 4)
       for ext in (".csv", "_timeline.csv", ".png")])
  parameters = (training.FEATURES * WIDTH + WIDTH) + 2 * (WIDTH * WIDTH +
                                                          WIDTH)
  memory = hook.results[4]
  assert len(memory) == 2
  for index, device in enumerate(memory):
    # Each replica's weights and momentum slots, or (shared weights) one
    # copy on replica 0's device; the device holding the shared
    # global_step has 8 bytes more.
    held = 0 if layout == "shared_weights" and index else parameters
    assert 0 <= device.persistent - 2 * 4 * held <= 8, device
    # At least one layer's activations of the 32-row batch.
    assert device.step_peak >= 32 * WIDTH * 4, device
    assert device.peak == device.persistent + device.step_peak
  with open(tmp_path / "step_4_memory.csv") as rows:
    table = list(csv.DictReader(rows))
  assert [int(r["peak_bytes"]) for r in table] == [m.peak for m in memory]


def test_hook_arguments_are_checked():
  with pytest.raises(ValueError, match="save_steps"):
    MemoryProfilerHook(save_steps=6, max_steps=5)


def _ops_by_type(graph, op_type):
  return [op for op in graph.get_operations() if op.type == op_type]


def test_flops_of_matrix_products_equal_hand_counts():
  graph = tf.Graph()
  with graph.as_default():
    x = tf.zeros([10, 10])
    tf.compat.v1.layers.dense(x, 16, activation=tf.nn.tanh, name="dense")
    a, b = tf.zeros([4, 3, 5, 7]), tf.zeros([4, 3, 7, 2])
    tf.matmul(a, b, name="batch_matmul")
    tf.einsum("bst,th->bsh", tf.zeros([2, 5, 3]), tf.zeros([3, 8]),
              name="einsum")
    tf.einsum("...ij,...jk->...ik", a, b, name="einsum_ellipsis")
    tf.einsum("bij->bi", tf.zeros([2, 3, 4]), name="einsum_sum")
    tf.einsum("ij->ji", tf.zeros([3, 4]), name="einsum_transpose")
    tf.nn.log_softmax(tf.zeros([4, 6]), name="log_softmax")
    unknown = tf.compat.v1.placeholder(tf.float32, [None, 10])
    tf.matmul(unknown, tf.zeros([10, 16]), name="unknown_batch")
  counts = flops.profile_flops(graph)
  assert counts["dense/MatMul"] == 10 * 10 * 16 * 2
  assert counts["dense/BiasAdd"] == 10 * 16
  assert counts["dense/Tanh"] == 10 * 16
  assert _ops_by_type(graph, "BatchMatMulV2")
  assert counts["batch_matmul"] == 4 * 3 * 5 * 7 * 2 * 2
  einsum = {op.name: counts[op.name] for op in _ops_by_type(graph, "Einsum")}
  assert sorted(einsum.values()) == sorted(
      [2 * 5 * 3 * 8 * 2, 4 * 3 * 5 * 7 * 2 * 2, 2 * 3 * 4, 0])
  assert counts["log_softmax"] == 5 * 4 * 6
  # Unknown dimensions count as `unknown_dim` (the batch size).
  assert counts["unknown_batch"] == 1 * 10 * 16 * 2
  assert flops.profile_flops(graph, unknown_dim=32)["unknown_batch"] == (
      32 * 10 * 16 * 2)
  # Registered in TensorFlow's table: its own profiler counts einsums too.
  einsum_graph = tf.Graph()
  with einsum_graph.as_default():
    tf.einsum("bst,th->bsh", tf.zeros([2, 5, 3]), tf.zeros([3, 8]))
    profile = tf.compat.v1.profiler.profile(
        einsum_graph, options=tf.compat.v1.profiler.ProfileOptionBuilder
        .float_operation())
  assert profile.total_float_ops == 2 * 5 * 3 * 8 * 2


def test_einsum_flops_of_equations():
  assert flops.einsum_flops("ij,jk->ik", [[2, 3], [3, 4]]) == 2 * 2 * 3 * 4
  assert flops.einsum_flops("ij,ij->ij", [[2, 3], [2, 3]]) == 6
  assert flops.einsum_flops("ij,jk", [[2, 3], [3, 4]]) == 2 * 2 * 3 * 4
  assert flops.einsum_flops("...ij,jk->...ik", [[5, 2, 3], [3, 4]]) == (
      2 * 5 * 2 * 3 * 4)
  assert flops.einsum_flops("ii->i", [[3, 3]]) == 0


def test_tensor_and_parameter_bytes():
  graph = tf.Graph()
  with graph.as_default():
    x = tf.zeros([10, 10])
    y = tf.compat.v1.layers.dense(x, 16, name="dense")
    kernel = graph.get_operation_by_name("dense/kernel")
  assert flops.variable_elements(kernel) == 10 * 16
  assert flops.variable_bytes(kernel) == 10 * 16 * 4
  assert flops.tensor_bytes(y) == 10 * 16 * 4
  assert flops.tensor_bytes(tf.constant(1, tf.int64, shape=[3])) == 24
  cost = flops.summarize([kernel, y.op])
  assert (cost.ops, cost.flops, cost.parameter_bytes,
          cost.activation_bytes) == (2, 10 * 16, 10 * 16 * 4, 10 * 16 * 4)


def test_costs_per_taskgraph():
  epl.init(epl.Config({"cluster.num_cpu_devices": 2}))
  graph = tf.Graph()
  with graph.as_default():
    x = tf.zeros([10, 8])
    with epl.replicate(device_count=1, name="first"):
      hidden = tf.compat.v1.layers.dense(x, 16, name="one")
    with epl.replicate(device_count=1, name="second"):
      out = tf.compat.v1.layers.dense(hidden, 4, name="two")
  forward = graph_editor.ancestors([out.op])
  costs = flops.taskgraph_costs(graph, forward)
  assert costs[0].flops == 10 * 8 * 16 * 2 + 10 * 16
  assert costs[1].flops == 10 * 16 * 4 * 2 + 10 * 4
  assert costs[0].parameter_bytes == (8 * 16 + 16) * 4
  assert costs[1].parameter_bytes == (16 * 4 + 4) * 4


def test_flops_hook_counts_the_traced_step_per_taskgraph(caplog):
  # Two pipeline stages (one dense layer each) x 2 replicas, 2 micro-batches
  # of 16 rows.
  micro_batch = 16
  epl.init(epl.Config({"cluster.num_cpu_devices": 4,
                       "pipeline.num_micro_batch": 2}))
  hook = flops.FlopsProfilerHook(log_steps=2)
  logger = logging.getLogger("epl")
  logger.addHandler(caplog.handler)
  try:
    with tf.Graph().as_default():
      x, y = training.input_batch(micro_batch)
      loss = tf.reduce_mean(tf.square(training.staged_model()(x) - y))
      step = tf.compat.v1.train.get_or_create_global_step()
      train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
          loss, global_step=step)
      with tf.compat.v1.train.MonitoredTrainingSession(hooks=[
          hook, tf.compat.v1.train.StopAtStepHook(last_step=5)]) as sess:
        while not sess.should_stop():
          sess.run(train_op)
  finally:
    logger.removeHandler(caplog.handler)
  # The batch size is unknown statically ([None, 8]): the counts use the
  # shapes the traced step had, for every replica and micro-batch.
  forward = 2 * micro_batch * training.FEATURES * 16
  for prefix in ("", "EPL_MICRO_BATCH_1/", "EPL_REPLICA_1/",
                 "EPL_REPLICA_1/EPL_MICRO_BATCH_1/"):
    assert hook.op_flops[prefix + "layer_0/MatMul"] == forward, prefix
  # The input and kernel gradients: (16 x 16) (16 x 8) and (8 x 16) (16 x 16).
  kernel_grads = [n for n in hook.op_flops
                  if n.startswith("gradients/layer_0/MatMul_grad/MatMul")]
  assert sorted(hook.op_flops[n] for n in kernel_grads) == [forward] * 2
  # Stage 0 (layer_0: 8 -> 16, tanh) computes more than stage 1 (16 -> 1
  # and the loss); every op that counts is in one of them, or (None) in
  # the sums of gradients over replicas, which belong to no stage.
  stages = hook.taskgraph_flops
  assert stages[0] > stages[1] > 0
  assert sum(stages.values()) == hook.flops_per_step
  assert stages.get(None, 0) < stages[1]
  assert hook.flops_per_step == sum(hook.op_flops.values())
  # Forward and two gradient products of layer_0, per replica and
  # micro-batch, at least.
  assert stages[0] > 4 * 3 * forward
  assert len(hook.step_times) == 4
  assert hook.flops_per_second > 0
  assert "FLOPs profiler: TaskGraph 1" in caplog.text
  assert "FLOP/s" in caplog.text


def test_flops_hook_arguments_are_checked():
  with pytest.raises(ValueError, match="log_steps"):
    flops.FlopsProfilerHook(log_steps=0)
