"""Gradient accumulation as a loop (pipeline.accumulation "loop"): with
one stage, the micro-batches of a step run as a while-loop over the
user's own forward and backward ops, with the results of single-device
TensorFlow on the whole batch."""
import logging

import numpy as np
import pytest
import tensorflow as tf

import epl
from tests import training

REPLICAS, MICRO_BATCHES, ROWS = 2, 4, 4


def _loop_config(**extra):
  config = {"cluster.num_cpu_devices": REPLICAS,
            "pipeline.num_micro_batch": MICRO_BATCHES,
            "pipeline.accumulation": "loop"}
  config.update(extra)
  return config


def _copied_forward_ops(graph):
  """Names of micro-batch copies other than input reads."""
  return [op.name for op in graph.get_operations()
          if op.name.startswith("EPL_MICRO_BATCH_1/") and
          op.type not in ("IteratorGetNext",)]


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_loop_matches_single_device(optimizer):
  expected, expected_losses, _ = training.train(
      optimizer=optimizer, batch_size=REPLICAS * MICRO_BATCHES * ROWS,
      with_epl=False)
  actual, losses, graph = training.train(
      optimizer=optimizer, batch_size=ROWS, config=_loop_config())
  training.assert_close(actual, expected)
  assert not _copied_forward_ops(graph)
  assert any(op.type == "Exit" for op in graph.get_operations())
  # The fetched loss is micro-batch 0's of replica 0: finite, and the
  # loss of the first rows of the global batch.
  assert np.all(np.isfinite(losses)) and losses[0] != expected_losses[0]


def test_copies_key_keeps_one_copy_per_micro_batch():
  expected, _, _ = training.train(
      batch_size=REPLICAS * MICRO_BATCHES * ROWS, with_epl=False)
  actual, _, graph = training.train(
      batch_size=ROWS, config=_loop_config(**{
          "pipeline.accumulation": "copies"}))
  training.assert_close(actual, expected)
  assert _copied_forward_ops(graph)
  assert not any(op.type == "Exit" for op in graph.get_operations())


def _clipped(accumulation, after_allreduce):
  epl.init(epl.Config(_loop_config(**{
      "pipeline.accumulation": accumulation,
      "communication.clip_after_allreduce": after_allreduce})))
  epl.set_default_strategy(epl.replicate(device_count=1))
  values = training.clipped_training(training.OPTIMIZERS["momentum"], ROWS)
  epl.shutdown()
  return values


@pytest.mark.parametrize("after_allreduce", [False, True])
def test_clipping_in_loop_keeps_its_semantics(after_allreduce, caplog):
  # The loop clips what the copies clip: the accumulated gradient of each
  # replica, or after the all-reduce that of the whole batch.
  with training.epl_logs_caught(caplog):
    actual = _clipped("loop", after_allreduce)
  # Clipping per replica differs from one device: the rewrite says so.
  said = "each of the %d replicas changes its own gradient" % REPLICAS
  assert (said in caplog.text) is not after_allreduce, caplog.text
  training.assert_close(actual, _clipped("copies", after_allreduce))
  if after_allreduce:
    training.assert_close(actual, training.clipped_training(
        training.OPTIMIZERS["momentum"], REPLICAS * MICRO_BATCHES * ROWS))


def test_several_gradient_calls_accumulate_each():
  def build(batch):
    x, y = training.input_batch(batch)
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    variables = tf.compat.v1.trainable_variables()
    first = tf.gradients(loss, variables[:2])
    second = tf.gradients(loss, variables[2:])
    optimizer = training.OPTIMIZERS["sgd"]()
    # Every update after every gradient: with reference variables plain
    # TF would otherwise race an update against a read of the backward.
    with tf.control_dependencies(first + second):
      return optimizer.apply_gradients(
          list(zip(first + second, variables)))
  graph = tf.Graph()
  with graph.as_default():
    expected = training.run_steps(
        graph, build(REPLICAS * MICRO_BATCHES * ROWS), 3)
  epl.init(epl.Config(_loop_config()))
  epl.set_default_strategy(epl.replicate(device_count=1))
  graph = tf.Graph()
  with graph.as_default():
    actual = training.run_steps(graph, build(ROWS), 3)
  epl.shutdown()
  training.assert_close(actual, expected)
  assert not _copied_forward_ops(graph)


def test_dropout_draws_other_numbers_in_each_micro_batch():
  epl.init(epl.Config(_loop_config(**{"cluster.num_cpu_devices": 1})))
  epl.set_default_strategy(epl.replicate(device_count=1))
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(7)
    x, y = training.input_batch(ROWS)
    kept = tf.nn.dropout(tf.ones_like(x), rate=0.5)
    epl.add_to_collection(kept, epl.GraphKeys.GLOBAL_CONCAT_OBJECTS)
    loss = tf.reduce_mean(tf.square(training.layers_model(x * kept) - y))
    train_op = training.OPTIMIZERS["sgd"]().minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      _, masks = session.run([train_op, kept])
  epl.shutdown()
  parts = np.split(masks, MICRO_BATCHES)
  assert len({part.tobytes() for part in parts}) == MICRO_BATCHES


def test_stateless_random_op_falls_back_to_copies_with_a_warning(caplog):
  caplog.set_level(logging.INFO, logger="epl")
  epl.init(epl.Config(_loop_config()))
  epl.set_default_strategy(epl.replicate(device_count=1))
  graph = tf.Graph()
  with graph.as_default(), training.epl_logs_caught(caplog):
    x, y = training.input_batch(ROWS)
    noise = tf.random.stateless_uniform(tf.shape(x), seed=[1, 2])
    loss = tf.reduce_mean(tf.square(training.layers_model(x + noise) - y))
    train_op = training.OPTIMIZERS["sgd"]().minimize(loss)
    training.run_steps(graph, train_op, 1)
  epl.shutdown()
  assert "not as a loop" in caplog.text and "stateless" in caplog.text
  assert _copied_forward_ops(graph)
  # The plan's line says what runs: copies, not the loop it asked for.
  plan = [r.getMessage() for r in caplog.records
          if r.getMessage().startswith("EPL plan: micro-batches:")]
  assert len(plan) == 1 and plan[0].startswith(
      "EPL plan: micro-batches: copies (asked: loop), because op ") and (
          "is a stateless random op" in plan[0]), caplog.text


def test_reference_variables_in_the_loop_match_single_device():
  # The backward reads w2 (a VariableV2, read without a copy) in every
  # iteration: w2's update, after the loop, must wait for the last one.
  # The loop's counter waits for every sum of its iteration, and its Exit
  # for the counter, so the update (which reads a sum) does.
  expected, _ = training.reference_variable_training(
      REPLICAS * MICRO_BATCHES * ROWS, False)
  actual, graph = training.reference_variable_training(
      ROWS, True, _loop_config())
  training.assert_close(actual, expected)
  sums = {op.name for op in graph.get_operations()
          if op.name.startswith("EPL_MICRO_BATCH_LOOP/while/") and
          op.type == "AddV2"}
  # The counter's increment (through its constant) waits for the sums.
  waits = [op for op in graph.get_operations()
           if op.name.startswith("EPL_MICRO_BATCH_LOOP/while/") and
           {c.name for c in op.control_inputs} & sums]
  assert waits and any(
      c.name in sums for op in waits for c in op.outputs[0].consumers())
