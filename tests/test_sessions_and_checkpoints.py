"""Data-parallel runs through the user's own sessions, hooks and Savers."""
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import epl
from tests import tolerance
from tests import training

REPLICAS = 4
MICRO = 8


def _build(batch_size, optimizer="momentum", model=training.layers_model):
  x, y = training.input_batch(batch_size)
  loss = tf.reduce_mean(tf.square(model(x) - y))
  step = tf.compat.v1.train.get_or_create_global_step()
  train_op = training.OPTIMIZERS[optimizer]().minimize(loss, global_step=step)
  return loss, step, train_op


def _init_epl(layout=None):
  epl.init(epl.Config(dict(training.WEIGHT_LAYOUTS.get(layout, {}),
                           **{"cluster.num_cpu_devices": REPLICAS})))
  epl.set_default_strategy(epl.replicate(device_count=1))


def _epl_or_plain(with_epl):
  """EPL data parallel over REPLICAS devices, or plain TensorFlow."""
  if with_epl:
    _init_epl()
  else:
    epl.shutdown()


def _replica_names(graph, name):
  return training.replica_copies(graph, name, REPLICAS)


def test_monitored_training_session_with_hooks(tmp_path):
  expected, _, _ = training.train(batch_size=REPLICAS * MICRO, with_epl=False)
  _init_epl()
  graph = tf.Graph()
  logged = []

  class RecordLoss(tf.compat.v1.train.SessionRunHook):

    def before_run(self, run_context):
      return tf.compat.v1.train.SessionRunArgs(loss)

    def after_run(self, run_context, run_values):
      logged.append(run_values.results)

  with graph.as_default():
    loss, step, train_op = _build(MICRO)
    epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    tf.compat.v1.summary.scalar("loss", loss)
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=5),
             tf.compat.v1.train.LoggingTensorHook({"loss": loss},
                                                  every_n_iter=1),
             RecordLoss()]
    steps = 0
    with tf.compat.v1.train.MonitoredTrainingSession(
        checkpoint_dir=str(tmp_path), hooks=hooks, save_checkpoint_steps=5,
        save_summaries_steps=1, log_step_count_steps=None) as session:
      while not session.should_stop():
        session.run(train_op)
        steps += 1
  assert steps == 5 and len(logged) == 5
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path))
  checkpoint = tf.train.latest_checkpoint(str(tmp_path))
  assert checkpoint.endswith("-5")
  stored = dict(tf.train.list_variables(checkpoint))
  assert not any("EPL_" in name for name in stored)
  reader = tf.train.load_checkpoint(checkpoint)
  actual = {name: reader.get_tensor(name) for name in expected
            if name != "global_step"}
  actual["global_step"] = reader.get_tensor("global_step")
  training.assert_close(actual, expected)


def test_merged_fetches_match_the_global_batch():
  epl.shutdown()
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(REPLICAS * MICRO)
    prediction = training.layers_model(x)
    loss = tf.reduce_mean(tf.square(prediction - y))
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      want_loss, want_prediction, want_y = session.run([loss, prediction, y])
  _init_epl()
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(MICRO)
    prediction = training.layers_model(x)
    loss = tf.reduce_mean(tf.square(prediction - y))
    total = tf.reduce_sum(tf.square(prediction - y))
    epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    epl.add_to_collection(total, epl.GraphKeys.GLOBAL_SUM_OBJECTS)
    epl.add_to_collection(prediction, epl.GraphKeys.GLOBAL_CONCAT_OBJECTS)
    epl.add_to_collection(y, epl.GraphKeys.GLOBAL_CONCAT_OBJECTS)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.0).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      _, got = session.run([train_op, {"loss": loss, "total": total.name,
                                       "prediction": prediction, "y": y}])
  np.testing.assert_allclose(got["y"], want_y)
  tolerance.assert_equivalent(got["prediction"], want_prediction)
  tolerance.assert_equivalent(got["loss"], want_loss)
  tolerance.assert_equivalent(got["total"], want_loss * REPLICAS * MICRO)


def _save_single_device(path):
  epl.shutdown()
  graph = tf.Graph()
  with graph.as_default():
    _build(MICRO)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      tf.compat.v1.train.Saver().save(session, path)


@pytest.mark.parametrize("layout", training.WEIGHT_LAYOUTS)
def test_single_device_checkpoint_restores_into_every_replica(tmp_path,
                                                               layout):
  path = str(tmp_path / "single")
  _save_single_device(path)
  reader = tf.train.load_checkpoint(path)
  _init_epl(layout)
  graph = tf.Graph()
  with graph.as_default():
    _, _, train_op = _build(MICRO)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)  # moves every replica away from the checkpoint
      saver.restore(session, path)
      names = [n for r in ["dense/kernel", "dense_1/bias"]
               for n in _replica_names(graph, r)]
      assert len(names) == (2 if layout == "shared_weights" else
                            2 * REPLICAS)
      values = training.read_variables(session, graph, names)
  for name, value in values.items():
    original = name.split("/", 1)[1] if name.startswith("EPL_") else name
    np.testing.assert_array_equal(value, reader.get_tensor(original), name)


def _narrow_model(x):
  """training.layers_model with 8 hidden units instead of 16."""
  hidden = tf.compat.v1.layers.dense(x, 8, activation=tf.nn.tanh)
  return tf.compat.v1.layers.dense(hidden, 1)


@pytest.mark.parametrize("layout", training.WEIGHT_LAYOUTS)
def test_checkpoint_of_other_shapes_is_refused_before_restoring(tmp_path,
                                                                layout):
  # TensorFlow alone would give each resource variable the checkpoint's
  # shape and fail steps later, if at all (a bias broadcasts).
  path = str(tmp_path / "wide")
  _save_single_device(path)
  _init_epl(layout)
  graph = tf.Graph()
  with graph.as_default():
    _, _, train_op = _build(MICRO, model=_narrow_model)
    saver = tf.compat.v1.train.Saver()
    names = _replica_names(graph, "dense/bias")
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)
      before = training.read_variables(session, graph, names)
      with pytest.raises(ValueError) as error:
        saver.restore(session, path)
      after = training.read_variables(session, graph, names)
  message = str(error.value)
  assert message.startswith("Checkpoint %s does not fit this model: " % path)
  for wrong in ("dense/bias: [16] in the checkpoint, [8] in the model",
                "dense/kernel/Momentum: [%d, 16] in the checkpoint, [%d, 8] "
                "in the model" % (training.FEATURES, training.FEATURES),
                "dense_1/kernel: [16, 1] in the checkpoint, "
                "[8, 1] in the model"):
    assert wrong in message
  assert message.endswith("Restore it into the model that saved it, or "
                          "rebuild the variables with the checkpoint's "
                          "shapes.")
  training.assert_close(after, before, atol=0)


def test_data_parallel_checkpoint_restores_into_single_device(tmp_path):
  path = str(tmp_path / "parallel")
  _init_epl()
  graph = tf.Graph()
  with graph.as_default():
    _, _, train_op = _build(MICRO)
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(3):
        session.run(train_op)
      # A Saver built after the first step still sees one copy per variable.
      tf.compat.v1.train.Saver().save(session, path)
      trained = training.read_variables(session, graph, names)
  epl.shutdown()
  graph = tf.Graph()
  with graph.as_default():
    _, step, _ = _build(MICRO)
    with tf.compat.v1.Session() as session:
      tf.compat.v1.train.Saver().restore(session, path)
      restored = training.read_variables(session, graph, names)
      assert session.run(step) == 3
  training.assert_close(restored, trained, atol=0)


def test_saver_of_reference_variables_and_slots_is_not_training(tmp_path):
  # A Saver built before the first run: its SaveV2 reads every VariableV2
  # (weights, Adam's slots and powers) by reference, and writes none.
  path = str(tmp_path / "reference")

  def run(with_epl, batch_size, restore=False):
    _epl_or_plain(with_epl)
    graph = tf.Graph()
    with graph.as_default():
      _, step, train_op = _build(batch_size, "adam",
                                 training.ref_variable_model)
      saver = tf.compat.v1.train.Saver()
      names = [v.op.name for v in tf.compat.v1.global_variables()]
      with tf.compat.v1.Session() as session:
        if restore:
          saver.restore(session, path)
        else:
          session.run(tf.compat.v1.global_variables_initializer())
          for _ in range(3):
            session.run(train_op)
          saver.save(session, path)
        return training.read_variables(session, graph, names)
  trained = run(True, MICRO)
  assert trained["global_step"] == 3 and "ref/w1/Adam_1" in trained
  training.assert_close(run(False, REPLICAS * MICRO, restore=True), trained,
                        atol=0)


def test_initializable_iterator_and_gradient_apis():
  """compute/apply_gradients and tf.gradients + apply_gradients, with an
  initializable iterator, equal single-device training."""
  def run(with_epl, batch_size, use_tf_gradients):
    _epl_or_plain(with_epl)
    graph = tf.Graph()
    with graph.as_default():
      x, y = training.input_batch(batch_size, initializable=True)
      loss = tf.reduce_mean(tf.square(training.get_variable_model(x) - y))
      optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
      variables = tf.compat.v1.trainable_variables()
      if use_tf_gradients:
        pairs = list(zip(tf.gradients(loss, variables), variables))
      else:
        pairs = optimizer.compute_gradients(loss)
      train_op = optimizer.apply_gradients(pairs)
      with tf.compat.v1.Session() as session:
        session.run([tf.compat.v1.global_variables_initializer(),
                     tf.compat.v1.tables_initializer()])
        for _ in range(5):
          session.run(train_op)
        return training.read_variables(session, graph,
                                       [v.op.name for v in variables])
  # The reference uses compute_gradients: with reference variables
  # (EPL_TEST_TF1_BEHAVIOUR=1), plain tf.gradients + apply_gradients may
  # update a weight before the backward op that reads it runs, differently
  # from run to run; EPL orders them (order_reference_updates).
  expected = run(False, REPLICAS * MICRO, use_tf_gradients=False)
  for use_tf_gradients in (False, True):
    training.assert_close(run(True, MICRO, use_tf_gradients), expected)


def test_clip_after_allreduce_matches_single_device_clipping():
  def run(with_epl, batch_size):
    if with_epl:
      epl.init(epl.Config({"cluster.num_cpu_devices": REPLICAS,
                           "communication.clip_after_allreduce": True}))
      epl.set_default_strategy(epl.replicate(device_count=1))
    else:
      epl.shutdown()
    return training.clipped_training(
        lambda: tf.compat.v1.train.MomentumOptimizer(0.05, 0.9), batch_size)
  expected = run(False, REPLICAS * MICRO)
  training.assert_close(run(True, MICRO), expected)


def test_init_leaves_eager_execution_as_the_script_set_it():
  script = ("import tensorflow as tf, epl\n"
            "epl.init()\n"
            "assert tf.executing_eagerly()\n"
            "tf.compat.v1.disable_eager_execution()\n"
            "epl.init()\n"
            "assert not tf.executing_eagerly()\n"
            "print('as set')\n")
  result = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          text=True, timeout=120, check=False,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert result.returncode == 0, result.stderr
  assert "as set" in result.stdout


def test_summaries_of_merged_tensors_record_the_merged_value():
  epl.init(epl.Config({"cluster.num_cpu_devices": 4}))
  epl.set_default_strategy(epl.replicate(device_count=1))
  with tf.Graph().as_default():
    x, y = training.input_batch(8)
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    summary = tf.compat.v1.summary.scalar("loss", loss)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      _, printed, serialized = session.run([train_op, loss, summary])
  recorded = tf.compat.v1.Summary.FromString(serialized).value[0].simple_value
  tolerance.assert_equivalent(recorded, printed)
  replica_zero = training.train(batch_size=8, steps=1,
                                config={"cluster.num_cpu_devices": 1})[1][0]
  assert abs(printed - replica_zero) > 1e-6  # a mean over 4 batches
