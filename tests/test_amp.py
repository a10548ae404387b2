"""AMP O1: half-precision compute with float32 weights trains like float32
TensorFlow within half-precision noise, like the same model cast to float16
by hand, and the dynamic loss scale skips overflowing steps everywhere."""
import logging

import numpy as np
import pytest
import tensorflow as tf

import epl
from epl.ir import graph_editor
from epl.ir.graph_state import state_of
from epl.ir import names
from epl.parallel.passes import loss_scale
from tests import tolerance
from tests import training

FP16_TOLERANCE = tolerance.AMP_TOLERANCE["float16"]
HAND_CAST_TOLERANCE = 5e-4  # measured 6e-6 (Adam) and 3e-4 (momentum)


def hand_cast_model(x):
  """training.layers_model with the same variables, cast to float16 by
  hand where AMP O1 converts it: both matmuls, the first bias and tanh."""
  def variables(scope, shape, seed):
    with tf.compat.v1.variable_scope(scope):
      kernel = tf.compat.v1.get_variable(
          "kernel", shape,
          initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed))
      bias = tf.compat.v1.get_variable(
          "bias", shape[1:], initializer=tf.compat.v1.zeros_initializer())
    return kernel, bias

  def half(t):
    return tf.cast(t, tf.float16)
  kernel, bias = variables("dense", [training.FEATURES, 16], 1)
  hidden = tf.tanh(tf.nn.bias_add(tf.matmul(half(x), half(kernel)),
                                  half(bias)))
  kernel, bias = variables("dense_1", [16, 1], 2)
  return tf.nn.bias_add(tf.cast(tf.matmul(hidden, half(kernel)),
                                tf.float32), bias)


def _amp(devices=1, **extra):
  config = {"amp.level": "O1", "amp.loss_scale": 128,
            "cluster.num_cpu_devices": devices}
  config.update(extra)
  return config


def _half_ops(graph, dtype="float16"):
  return [op.name for op in graph.get_operations()
          if op.name.endswith(names.half_precision("", dtype))]


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_o1_single_device(optimizer):
  expected, _, _ = training.train(optimizer=optimizer, with_epl=False)
  by_hand, _, _ = training.train(hand_cast_model, optimizer,
                                 with_epl=False)
  actual, _, graph = training.train(optimizer=optimizer, config=_amp())
  training.assert_close(actual, by_hand, atol=HAND_CAST_TOLERANCE)
  training.assert_close(actual, expected, atol=FP16_TOLERANCE)
  half = _half_ops(graph)
  for name in ("dense/MatMul", "dense/BiasAdd", "dense/Tanh",
               "dense_1/MatMul", "gradients/dense_1/MatMul_grad/MatMul",
               "gradients/dense/MatMul_grad/MatMul_1"):
    assert names.half_precision(name, "float16") in half
  # Weights stay float32 and are cast by each consumer.
  kernel = graph.get_operation_by_name("dense/kernel")
  assert kernel.get_attr("dtype") == tf.float32
  assert not any(op.name.startswith(names.half_precision("dense_1/BiasAdd",
                                                         ""))
                 for op in graph.get_operations())
  # The float32 originals of converted ops no longer run.
  state = state_of(graph)
  step = {op.name for op in graph_editor.ancestors(
      [state.apply_records[0].train_op])}
  assert names.half_precision("dense/MatMul", "float16") in step
  assert not {"dense/MatMul", "dense/Tanh", "dense_1/MatMul"} & step


def test_o1_four_replicas_and_micro_batches():
  expected, _, _ = training.train(batch_size=64, with_epl=False)
  by_hand, _, _ = training.train(hand_cast_model, batch_size=64,
                                 with_epl=False)
  actual, _, _ = training.train(
      batch_size=8, config=_amp(4, **{"pipeline.num_micro_batch": 2}))
  # Replicas sum gradients of 8-row batches in float32 where the hand-cast
  # model sums 64 rows in float16: within half-precision noise of both.
  training.assert_close(actual, by_hand, atol=FP16_TOLERANCE)
  training.assert_close(actual, expected, atol=FP16_TOLERANCE)


def test_bfloat16_needs_no_loss_scale():
  expected, _, _ = training.train(with_epl=False)
  actual, _, graph = training.train(config=_amp(**{"amp.dtype": "bfloat16"}))
  training.assert_close(actual, expected,
                        atol=tolerance.AMP_TOLERANCE["bfloat16"])
  assert names.half_precision("dense/MatMul", "bfloat16") in _half_ops(
      graph, "bfloat16")
  assert not [op for op in graph.get_operations()
              if op.name.startswith(names.AMP_LOSS_SCALE)]


def test_debug_log_names_converted_ops(caplog):
  with caplog.at_level(logging.INFO, logger="epl"):
    epl.shutdown()
    training.train(steps=1, config=_amp(**{"amp.debug_log": True}))
  assert "AMP: dense/MatMul (MatMul) runs in float16" in caplog.text


def _dynamic_run(steps, loss_factor, replicas=4, micro_batches=1):
  """Trains with a dynamic loss scale; returns per-step records of the
  scale, good steps, global_step and every replica's kernel."""
  epl.init(epl.Config(_amp(replicas, **{
      "amp.loss_scale": "dynamic",
      "pipeline.num_micro_batch": micro_batches})))
  epl.set_default_strategy(epl.replicate(device_count=1))
  graph = tf.Graph()
  history = []
  with graph.as_default():
    x, y = training.input_batch(8)
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(
        loss * loss_factor, global_step=step)
    init = tf.compat.v1.global_variables_initializer()
    kernels = ["dense/kernel", "dense/kernel/Momentum"] + [
        "EPL_REPLICA_%d/dense/kernel" % r for r in range(1, replicas)]
    with tf.compat.v1.Session() as session:
      session.run(init)
      initial = training.read_variables(session, graph, kernels)
      for _ in range(steps):
        session.run(train_op)
        history.append(training.read_variables(
            session, graph, kernels + [loss_scale.SCALE_VARIABLE,
                                       loss_scale.GOOD_STEPS_VARIABLE,
                                       step.op.name]))
  epl.shutdown()
  return history, initial


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_dynamic_scale_skips_overflowing_steps_on_every_replica(
    micro_batches):
  history, initial = _dynamic_run(steps=2, loss_factor=1e4,
                                  micro_batches=micro_batches)
  for index, record in enumerate(history, 1):
    assert record[loss_scale.SCALE_VARIABLE] == (
        loss_scale.INITIAL_SCALE / 2 ** index)
    assert record[loss_scale.GOOD_STEPS_VARIABLE] == 0
    assert record["global_step"] == 0
    # No replica's weights moved.
    for name, value in initial.items():
      np.testing.assert_array_equal(record[name], value)


def test_dynamic_scale_grows_after_the_period(monkeypatch):
  monkeypatch.setattr(loss_scale, "INCREMENT_PERIOD", 2)
  history, initial = _dynamic_run(steps=5, loss_factor=1e-3)
  scales = [r[loss_scale.SCALE_VARIABLE] for r in history]
  assert scales == [loss_scale.INITIAL_SCALE * f for f in (1, 2, 2, 4, 4)]
  assert [r[loss_scale.GOOD_STEPS_VARIABLE] for r in history] == [
      1, 0, 1, 0, 1]
  assert history[-1]["global_step"] == 5
  for name in initial:
    assert not np.allclose(history[-1][name], initial[name])
    if "Momentum" not in name:
      tolerance.assert_equivalent(history[-1][name],
                                 history[-1]["dense/kernel"])


def _deep_model(x, layers=4):
  hidden = x
  for index in range(layers):
    last = index == layers - 1
    hidden = tf.compat.v1.layers.dense(
        hidden, 1 if last else 16, activation=None if last else tf.nn.tanh,
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
            seed=10 + index))
  return hidden


def test_dynamic_scale_with_adam_and_global_step(monkeypatch):
  # Adam updates its beta powers after the variable updates, and
  # minimize(global_step=...) increments after them: the finiteness
  # decision reads only what comes before the updates (it waited for
  # them, a cycle). Starting at 128, no step overflows: it trains as the
  # fixed scale 128 does (Adam amplifies half-precision noise in gradients
  # near zero past FP16_TOLERANCE of float32 training, so that is the
  # reference).
  monkeypatch.setattr(loss_scale, "INITIAL_SCALE", 128.0)
  expected, _, _ = training.train(_deep_model, "adam", batch_size=8,
                                  config=_amp(4))
  epl.shutdown()
  actual, _, _ = training.train(
      _deep_model, "adam", batch_size=8,
      config=_amp(4, **{"amp.loss_scale": "dynamic"}))
  assert actual["global_step"] == 5
  training.assert_close(actual, expected)


def test_o1_pipeline_two_stages_two_replicas():
  model = training.staged_model((16, 1))
  expected, _, _ = training.train(model, batch_size=32, with_epl=False)
  actual, _, graph = training.train(
      model, batch_size=8, default_strategy=False,
      config=_amp(4, **{"pipeline.num_micro_batch": 2}))
  training.assert_close(actual, expected, atol=FP16_TOLERANCE)
  # Each stage's half-precision ops stay on the stage's device.
  for stage in range(2):
    half = graph.get_operation_by_name(
        names.half_precision("layer_%d/MatMul" % stage, "float16"))
    original = graph.get_operation_by_name("layer_%d/kernel" % stage)
    assert half.device == original.device
