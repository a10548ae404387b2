"""Gradient checkpointing trains like plain TensorFlow; recomputation runs in
backward, keeps random values, and is checked by check_gradients."""
import logging

import numpy as np
import pytest
import tensorflow as tf

import epl
from epl.ir import control_flow
from epl.ir import graph_editor
from epl.ir import names as epl_names
from epl.ir.graph_state import state_of
from epl.parallel.passes import gradient_checkpoint
from epl.parallel.passes import schedule
from tests import training

LAYERS = 4


def checkpointed_model(x, dropout=None):
  """LAYERS dense layers (tanh); the output of layer 1 is a checkpoint."""
  hidden = x
  for index in range(LAYERS):
    hidden = tf.compat.v1.layers.dense(
        hidden, 1 if index == LAYERS - 1 else 16,
        activation=None if index == LAYERS - 1 else tf.nn.tanh,
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
            seed=20 + index), name="dense%d" % index)
    if dropout is not None and index < LAYERS - 1:
      hidden = tf.nn.dropout(hidden, rate=dropout)
    if index == 1:
      tf.compat.v1.add_to_collection("checkpoints", hidden)
  return hidden


def staged_checkpointed_model(x):
  """checkpointed_model cut into two pipeline stages (two layers each)."""
  hidden = x
  for index in range(LAYERS):
    if index % 2 == 0 and epl.Env.initialised():
      stage = epl.replicate(device_count=1, name="stage_%d" % (index // 2))
      epl.set_default_strategy(stage)
    hidden = tf.compat.v1.layers.dense(
        hidden, 1 if index == LAYERS - 1 else 16,
        activation=None if index == LAYERS - 1 else tf.nn.tanh,
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
            seed=20 + index), name="dense%d" % index)
    if index in (0, 2):
      tf.compat.v1.add_to_collection("checkpoints", hidden)
  return hidden


def _recomputed(graph):
  return [op for op in graph.get_operations()
          if op.name.startswith(epl_names.GRADIENT_CHECKPOINTS)]


def _gc(kind, devices=1, **extra):
  config = {"gradient_checkpoint.type": kind,
            "gradient_checkpoint.check_gradients": True,
            "cluster.num_cpu_devices": devices}
  config.update(extra)
  return config


@pytest.mark.parametrize("kind", ["collection", "auto"])
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_single_device_equivalence(kind, optimizer):
  expected, _, _ = training.train(checkpointed_model, optimizer,
                                  with_epl=False)
  actual, _, graph = training.train(checkpointed_model, optimizer,
                                    config=_gc(kind))
  training.assert_close(actual, expected)
  recomputed = _recomputed(graph)
  assert recomputed
  if kind == "collection":
    # Layers 0 and 1 (before the checkpoint) are recomputed, layers 2 and 3
    # (the last block) are not, nor is the checkpoint itself.
    names = {op.name[len(epl_names.GRADIENT_CHECKPOINTS):]
             for op in recomputed}
    assert "dense0/Tanh" in names
    assert not any(n.startswith(("dense2", "dense3", "dense1/Tanh"))
                   for n in names)


def test_four_replicas():
  expected, _, _ = training.train(checkpointed_model, batch_size=64,
                                  with_epl=False)
  actual, _, graph = training.train(checkpointed_model, batch_size=16,
                                    config=_gc("collection", 4))
  training.assert_close(actual, expected)
  assert graph.get_operation_by_name(
      "EPL_REPLICA_3/" + epl_names.GRADIENT_CHECKPOINTS + "dense0/Tanh")


@pytest.mark.parametrize("accumulation", ["copies", "loop"])
def test_micro_batches_and_replicas(accumulation):
  expected, _, _ = training.train(checkpointed_model, "adam", batch_size=64,
                                  with_epl=False)
  actual, _, graph = training.train(
      checkpointed_model, "adam", batch_size=16,
      config=_gc("collection", 2, **{"pipeline.num_micro_batch": 2,
                                     "pipeline.accumulation": accumulation}))
  training.assert_close(actual, expected)
  recomputed = epl_names.GRADIENT_CHECKPOINTS + "dense0/Tanh"
  if accumulation == "copies":
    assert graph.get_operation_by_name("EPL_MICRO_BATCH_1/" + recomputed)
  else:
    # One recomputation, in the micro-batch loop.
    assert control_flow.in_loop(graph.get_operation_by_name(recomputed))


@pytest.mark.parametrize("kind", ["collection", "auto"])
def test_pipeline_two_stages_two_replicas(kind):
  expected, _, _ = training.train(staged_checkpointed_model, batch_size=64,
                                  with_epl=False)
  actual, _, graph = training.train(
      staged_checkpointed_model, batch_size=16, default_strategy=False,
      config=_gc(kind, 4, **{"pipeline.num_micro_batch": 2}))
  training.assert_close(actual, expected)
  state = state_of(graph)
  for op in _recomputed(graph):
    original = graph.get_operation_by_name(
        op.name[len(epl_names.GRADIENT_CHECKPOINTS):])
    # A recomputed op runs on its own stage's device, in backward.
    assert op.device == original.device
    assert state.taskgraph_of(op) is state.taskgraph_of(original)


def test_pipeline_zero_bubble():
  expected, _, _ = training.train(staged_checkpointed_model, "adam",
                                  batch_size=64, with_epl=False)
  actual, _, graph = training.train(
      staged_checkpointed_model, "adam", batch_size=16,
      default_strategy=False,
      config=_gc("collection", 2, **{"pipeline.num_micro_batch": 4,
                                     "pipeline.strategy": "ZeroBubble"}))
  training.assert_close(actual, expected)
  # Stage 0 recomputes dense1's output, which stage 1's kernel gradient
  # (its W) reads: another stage's backward reads it, so it is stage 0's
  # B, not W.
  result = state_of(graph).rewrite_result
  recomputed = epl_names.GRADIENT_CHECKPOINTS + "dense1/Tanh"
  [block] = [b for b, ops in schedule.blocks(
      result.context, result.subgraph, result.copies).items()
             if recomputed in [op.name for op in ops]]
  assert (block.stage, block.kind, block.micro_batch) == (0, "backward", 0)


def test_compute_gradients_and_tf_gradients():
  def build(use_tf_gradients):
    epl.init(epl.Config(_gc("collection")))
    epl.set_default_strategy(epl.replicate(device_count=1))
    graph = tf.Graph()
    with graph.as_default():
      x, y = training.input_batch(16)
      loss = tf.reduce_mean(tf.square(checkpointed_model(x) - y))
      optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.05)
      train_op = optimizer.apply_gradients(
          training.gradient_pairs(optimizer, loss, use_tf_gradients))
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
          session.run(train_op)
        values = training.read_variables(session, graph, [
            v.op.name for v in tf.compat.v1.trainable_variables()])
    epl.shutdown()
    return values, graph
  for use_tf_gradients in (False, True):
    actual, graph = build(use_tf_gradients)
    assert _recomputed(graph)
    expected, _, _ = training.train(checkpointed_model, "sgd", steps=3,
                                    with_epl=False, global_step=False)
    training.assert_close(actual, expected)


def test_recompute_waits_for_the_downstream_gradient():
  _, _, graph = training.train(checkpointed_model, steps=1,
                               config=_gc("collection"))
  first = graph.get_operation_by_name(
      epl_names.GRADIENT_CHECKPOINTS + "dense0/MatMul")
  waits = [op.name for op in first.control_inputs]
  # The recomputed layers wait for the gradient that reaches them (the
  # gradient of dense1's pre-activation, made after the backward of the
  # layers past the checkpoint), so they do not run while forward runs.
  assert waits == ["gradients/dense1/BiasAdd_grad/tuple/control_dependency"]


def test_dropout_mask_is_reused():
  _, losses, graph = training.train(
      lambda x: checkpointed_model(x, dropout=0.3), steps=3,
      config=_gc("collection"))
  types = {op.type for op in _recomputed(graph)}
  assert "RandomUniform" not in types
  assert "Tanh" in types
  assert np.all(np.isfinite(losses))


def test_check_gradients_catches_a_broken_recompute(monkeypatch):
  # Recomputing the unseeded dropout draws a new mask: the recomputed
  # gradients then differ from the plain ones.
  kept = gradient_checkpoint.never_recomputed
  monkeypatch.setattr(gradient_checkpoint, "never_recomputed",
                      lambda op: op.type != "RandomUniform" and kept(op))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="check_gradients: the recomputed gradient"):
    training.train(lambda x: checkpointed_model(x, dropout=0.5), steps=1,
                   config=_gc("collection"))


def test_auto_picks_one_checkpoint_per_transformer_layer(monkeypatch):
  chosen = []
  search = gradient_checkpoint.checkpoint_search.search
  monkeypatch.setattr(
      gradient_checkpoint.checkpoint_search, "search",
      lambda *args: chosen.extend(search(*args)) or chosen)
  training.train(transformer_model, "adam", steps=1, config=_gc("auto"))
  assert [t.op.name for t in chosen] == [
      "layer_%d/output/norm/mul" % i for i in range(3)]


def small_residual_blocks(x, blocks=4):
  """`blocks` identical residual blocks of 4 forward ops each (MatMul,
  BiasAdd, Relu, AddV2), fewer than gradient_checkpoint.min_block_ops."""
  init = tf.compat.v1.glorot_uniform_initializer(seed=3)
  hidden = x
  for index in range(blocks):
    with tf.compat.v1.variable_scope("block_%d" % index):
      hidden = hidden + tf.compat.v1.layers.dense(
          hidden, training.FEATURES, tf.nn.relu, kernel_initializer=init)
  return tf.compat.v1.layers.dense(hidden, 1, kernel_initializer=init)


@pytest.mark.parametrize("min_block_ops, decision", [
    (None, "no repeated blocks of at least 8 ops "
           "(gradient_checkpoint.min_block_ops); 4 repeated block(s) fell "
           "under it (the largest of 4 ops); "),
    (4, "4 repeated blocks of at least 4 ops "
        "(gradient_checkpoint.min_block_ops), one checkpoint each"),
])
def test_auto_block_threshold_is_configurable_and_reported(
    min_block_ops, decision, caplog, monkeypatch):
  """Blocks under gradient_checkpoint.min_block_ops (default
  MIN_BLOCK_OPS, 8) do not count, and the log line says which threshold
  it applied and how many repeated blocks fell under it; lowered to 4,
  each block's output is a checkpoint."""
  assert epl.Config().gradient_checkpoint.min_block_ops == \
      gradient_checkpoint.checkpoint_search.MIN_BLOCK_OPS == 8
  if min_block_ops is not None:
    monkeypatch.setenv("EPL_GRADIENT_CHECKPOINT_MIN_BLOCK_OPS",
                       str(min_block_ops))
  # EPL's logger writes to caplog (epl.init adds no handler of its own
  # to a logger that has one).
  monkeypatch.setattr(logging.getLogger("epl"), "handlers", [caplog.handler])
  with caplog.at_level(logging.INFO, logger="epl"):
    training.train(small_residual_blocks, steps=1, config=_gc("auto"))
  lines = [r.getMessage() for r in caplog.records]
  assert any(line.startswith("Gradient checkpointing (auto): " + decision)
             for line in lines), lines


def test_each_layer_is_recomputed_when_backward_reaches_it():
  _, _, graph = training.train(transformer_model, steps=1,
                               config=_gc("auto"))
  prefix = epl_names.GRADIENT_CHECKPOINTS
  first = graph.get_operation_by_name(prefix + "layer_1/q/Tensordot/transpose")
  waits_for = {op.name for op in graph_editor.ancestors([first])}
  # Layer 1 is recomputed after layer 2's backward, though the gate it
  # shares with every layer is recomputed with the last one.
  assert "gradients/layer_2/q/Tensordot/MatMul_grad/MatMul" in waits_for
  assert "gradients/layer_1/q/Tensordot/MatMul_grad/MatMul" not in waits_for
  assert prefix + "gate" in {op.name for op in graph.get_operations()}


def transformer_model(x, layers=3, width=8, heads=2):
  """A tiny transformer encoder over FEATURES tokens of one feature each."""
  init = tf.compat.v1.glorot_uniform_initializer(seed=5)
  hidden = tf.compat.v1.layers.dense(
      tf.expand_dims(x, -1), width, kernel_initializer=init, name="embed")
  # Read by every layer, like an attention mask.
  gate = tf.sigmoid(tf.reduce_mean(hidden, -1, keepdims=True), name="gate")
  for index in range(layers):
    with tf.compat.v1.variable_scope("layer_%d" % index):
      query, key, value = [
          tf.compat.v1.layers.dense(hidden, width, kernel_initializer=init,
                                    name=name) for name in ("q", "k", "v")]

      def split(t):
        return tf.transpose(tf.reshape(t, [-1, training.FEATURES, heads,
                                           width // heads]), [0, 2, 1, 3])
      scores = tf.matmul(split(query), split(key), transpose_b=True)
      context = tf.matmul(tf.nn.softmax(scores), split(value))
      context = gate * tf.reshape(tf.transpose(context, [0, 2, 1, 3]),
                                  [-1, training.FEATURES, width])
      hidden = _layer_norm(hidden + context, "attention")
      inner = tf.compat.v1.layers.dense(hidden, 2 * width, tf.nn.relu,
                                        kernel_initializer=init, name="ffn")
      with tf.compat.v1.variable_scope("output"):
        hidden = _layer_norm(hidden + tf.compat.v1.layers.dense(
            inner, width, kernel_initializer=init), "norm")
  return tf.compat.v1.layers.dense(tf.reduce_mean(hidden, 1), 1,
                                   kernel_initializer=init, name="head")


def _layer_norm(t, name):
  with tf.compat.v1.variable_scope(name):
    mean, variance = tf.nn.moments(t, [-1], keepdims=True)
    return (t - mean) * tf.math.rsqrt(variance + 1e-6)


def test_end_taskgraph_limits_auto_checkpoints(monkeypatch):
  expected, _, _ = training.train(staged_checkpointed_model, batch_size=16,
                                  with_epl=False)
  chosen = []
  choose = gradient_checkpoint.checkpoint_tensors
  monkeypatch.setattr(gradient_checkpoint, "checkpoint_tensors",
                      lambda ctx, ops: chosen.extend(choose(ctx, ops)) or
                      chosen)

  def checkpoint_stages(end):
    del chosen[:]
    actual, _, graph = training.train(
        staged_checkpointed_model, batch_size=16, default_strategy=False,
        config=_gc("auto", 2, **{"gradient_checkpoint.end_taskgraph": end}))
    training.assert_close(actual, expected)
    state = state_of(graph)
    return {state.taskgraph_of(t.op).index for t in chosen}
  assert checkpoint_stages(-1) == {0, 1}
  assert checkpoint_stages(0) == {0}


def test_with_amp_and_replicas():
  amp_config = {"amp.level": "O1", "amp.loss_scale": 128}
  expected, _, _ = training.train(
      checkpointed_model, "adam", batch_size=16,
      config=dict(amp_config, **{"cluster.num_cpu_devices": 2}))
  actual, _, graph = training.train(
      checkpointed_model, "adam", batch_size=16,
      config=_gc("collection", 2, **amp_config))
  # Recomputing the half-precision layers gives the same values.
  training.assert_close(actual, expected)
  assert graph.get_operation_by_name(
      epl_names.GRADIENT_CHECKPOINTS + "dense0/MatMul_EPL_AMP_float16")


@tf.custom_gradient
def _tanh_with_saved_slope(x):
  """tanh whose gradient reads a forward tensor nothing in forward reads."""
  y = tf.tanh(x)
  slope = tf.subtract(1.0, tf.square(y), name="slope")
  return y, lambda dy: dy * slope


def test_forward_values_only_backward_reads_are_recomputed():
  def model(x):
    hidden = _tanh_with_saved_slope(tf.compat.v1.layers.dense(
        x, 16, kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
            seed=1), name="dense0"))
    hidden = tf.compat.v1.layers.dense(
        hidden, 16, tf.nn.tanh, name="dense1",
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
    tf.compat.v1.add_to_collection("checkpoints", hidden)
    return tf.compat.v1.layers.dense(
        hidden, 1, name="dense2",
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=3))
  expected, _, _ = training.train(model, with_epl=False)
  actual, _, graph = training.train(model, config=_gc("collection"))
  training.assert_close(actual, expected)
  slope = [op.name for op in _recomputed(graph) if op.name.endswith("slope")]
  assert len(slope) == 1, [op.name for op in _recomputed(graph)]
