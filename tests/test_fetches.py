"""Fetches have one meaning whatever the layout: a tensor fetched beside
the train op or alone, in a training or an evaluation run, returns its
value and never hangs; a run whose collective group cannot be whole raises
before anything runs; a collective that times out on one worker says which
(epl/runtime/collective_groups.py, epl/runtime/failures.py)."""
import contextlib
import time

import numpy as np
import pytest
import tensorflow as tf

import epl
from epl.ir import collectives
from epl.runtime import failures
from epl.tf_compat.ops import collective_ops
from tests import test_composition_matrix as matrix
from tests import test_split
from tests import training

# A hang fails the test instead of the suite.
FETCH_TIMEOUT = 120
STEPS = 3


def _split_head_run(with_epl, metrics="inside", steps=STEPS):
  """tests/test_split.py's model with the usual loop of a classification
  script: `sess.run([train_op, loss, accuracy])`, the accuracy an argmax
  accuracy of the split logits, in no merged collection; then one
  evaluation run `sess.run([loss, accuracy])`. `metrics`: where the
  accuracy is built, "inside" the split scope or "outside" it. Returns
  (variables, [(loss, accuracy)] of each run)."""
  devices = test_split.DEVICES
  if with_epl:
    epl.init(epl.Config({"cluster.num_cpu_devices": devices,
                         "cluster.colocate_split_and_replicate": True}))
  graph = tf.Graph()
  with graph.as_default():
    batch = test_split.LOCAL_BATCH * (1 if with_epl else devices)
    x, labels = test_split._classification_batch(batch, 10)  # pylint: disable=protected-access
    with epl.replicate(devices) if with_epl else contextlib.nullcontext():
      hidden = tf.compat.v1.layers.dense(
          x, 16, activation=tf.nn.tanh, name="backbone",
          kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
    with epl.split(devices) if with_epl else contextlib.nullcontext():
      logits = tf.compat.v1.layers.dense(
          hidden, 10, name="head",
          kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
      loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
      if metrics == "inside":
        accuracy = _accuracy(logits, labels)
    if metrics == "outside":
      accuracy = _accuracy(logits, labels)
    train_op = training.OPTIMIZERS["momentum"]().minimize(loss)
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    results = []
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(steps):
        results.append(session.run([train_op, loss, accuracy])[1:])
      results.append(session.run([loss, accuracy]))
      values = training.read_variables(session, graph, names)
      if with_epl:
        values = test_split._trim(test_split._full_split_variables(  # pylint: disable=protected-access
            session, graph, values, devices), 10)
  epl.shutdown()
  return values, results


def _accuracy(logits, labels):
  predictions = tf.argmax(logits, axis=1)
  return tf.reduce_mean(tf.cast(tf.equal(predictions, labels), tf.float32))


@pytest.mark.timeout(FETCH_TIMEOUT)
@pytest.mark.parametrize("metrics", ["inside", "outside"])
def test_split_accuracy_beside_the_train_op_and_alone(metrics):
  # The accuracy gathers the shards' argmax over the shard group: replica
  # 0's value is the global batch's, as on one device; the evaluation run
  # (no train op) runs every replica's collectives too.
  expected, expected_results = _split_head_run(False, metrics)
  actual, results = _split_head_run(True, metrics)
  training.assert_close(actual, expected)
  np.testing.assert_allclose(np.array(results), np.array(expected_results),
                             rtol=1e-5, atol=1e-6)


@contextlib.contextmanager
def _small_split_head():
  """A backbone on 2 replicas and a split head over both, in a new graph
  under EPL; yields (logits, labels, loss)."""
  epl.init(epl.Config({"cluster.num_cpu_devices": 2,
                       "cluster.colocate_split_and_replicate": True}))
  with tf.Graph().as_default():
    x, labels = test_split._classification_batch(4, 10)  # pylint: disable=protected-access
    with epl.replicate(2):
      hidden = tf.compat.v1.layers.dense(x, 8, name="backbone")
    with epl.split(2):
      logits = tf.compat.v1.layers.dense(hidden, 10, name="head")
      loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    yield logits, labels, loss


@pytest.mark.timeout(FETCH_TIMEOUT)
def test_split_metrics_outside_the_scope_in_a_merged_collection_raise():
  with _small_split_head() as (logits, labels, loss):
    accuracy = _accuracy(logits, labels)
    epl.add_to_collection(accuracy, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session() as session:
      with pytest.raises(ValueError, match=(
          r"output of split scope 'split_\d+'.*inside the `with "
          r"epl.split\(\.\.\.\)` block")):
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(train_op)
  epl.shutdown()


@pytest.mark.timeout(FETCH_TIMEOUT)
def test_a_collective_built_after_the_rewrite_raises_before_running():
  # An argmax of the split logits built after the first run has no copy
  # in the other replicas: its group can never be whole.
  with _small_split_head() as (logits, _, loss):
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)
      with epl.split(2):
        late = tf.argmax(logits, axis=1)
      start = time.monotonic()
      with pytest.raises(collectives.BrokenGroupError,
                         match=r"needs 2 member\(s\), but 1 exist.*before "
                               r"the first Session.run"):
        session.run(late)
      assert time.monotonic() - start < 10
  epl.shutdown()


@pytest.mark.timeout(FETCH_TIMEOUT)
def test_a_group_broken_by_hand_raises_at_the_rewrite():
  # A collective of 2 with one member: the rewrite proves it can never
  # complete, before the first step runs anything.
  with pytest.raises(collectives.BrokenGroupError, match=(
      r"after the rewrite, the graph has collective 'CollectiveReduceV2'.*"
      r"group key 99, instance key 5\) needs 2 member\(s\), but 1 exist")):
    for _ in _layout_session("dp", build_first=lambda: (
        collective_ops.all_reduce_v2(tf.constant([1.0]), 2, 99, 5))):
      pass
  epl.shutdown()


@pytest.mark.timeout(FETCH_TIMEOUT)
def test_a_stalled_collective_times_out_naming_it():
  # Both members exist, but the second waits on an empty queue: only the
  # timeout can tell, and the error names the collective and its members.
  epl.init(epl.Config({"cluster.num_cpu_devices": 2}))
  with tf.Graph().as_default():
    value = tf.constant([1.0, 2.0])
    with tf.device("/device:CPU:0"):
      first = collective_ops.all_reduce_v2(value, 2, 77, 1, timeout=2.0)
    with tf.device("/device:CPU:1"):
      empty = tf.queue.FIFOQueue(1, tf.float32, shapes=[2])
      second = collective_ops.all_reduce_v2(empty.dequeue(), 2, 77, 1,
                                            timeout=2.0)
    with tf.compat.v1.Session() as session:
      start = time.monotonic()
      with pytest.raises(failures.CollectiveTimeoutError) as raised:
        session.run([first, second])
      waited = time.monotonic() - start
  message = str(raised.value).split("\n")[0]
  for name in (first.op.name, second.op.name, "CPU:0", "CPU:1",
               "group key 77", "timeout of 2 s"):
    assert name in message, (name, message)
  assert "worker" not in message
  assert waited < 30, waited
  epl.shutdown()


def _layout_session(layout, merge_activation=False, build_first=None):
  """Builds `layout`'s model under EPL (after `build_first()`, if given);
  yields (session, train_op, loss, activation), the activation in
  GLOBAL_CONCAT_OBJECTS if asked."""
  chosen = matrix.LAYOUTS[layout]
  epl.init(epl.Config(dict(chosen.config)))
  graph = tf.Graph()
  with graph.as_default():
    if build_first is not None:
      build_first()
    loss = chosen.build(chosen.batch, True)
    activation = _first_activation(graph)
    if merge_activation:
      epl.add_to_collection(activation, epl.GraphKeys.GLOBAL_CONCAT_OBJECTS)
    train_op = training.OPTIMIZERS["momentum"]().minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      yield session, train_op, loss, activation
  epl.shutdown()


def _first_activation(graph):
  """An intermediate activation of the model: the first layer's output."""
  return next(op.outputs[0] for op in graph.get_operations()
              if op.type == "Tanh")


@pytest.mark.timeout(FETCH_TIMEOUT)
@pytest.mark.parametrize("layout", sorted(matrix.LAYOUTS))
def test_every_layout_answers_fetches_with_and_without_the_train_op(layout):
  for session, train_op, loss, activation in _layout_session(layout):
    # In the micro-batch loop an activation exists once per micro-batch.
    fetches = [loss] if layout == "acc_loop" else [loss, activation]
    for run in ([train_op] + fetches, fetches, [train_op], [loss]):
      values = session.run(run)
      assert all(np.all(np.isfinite(v)) for v in values
                 if v is not None), (layout, run)


@pytest.mark.timeout(FETCH_TIMEOUT)
def test_a_tensor_in_the_micro_batch_loop_raises_naming_the_fix():
  for session, train_op, _, activation in _layout_session("acc_loop"):
    with pytest.raises(ValueError, match=(
        r"micro-batch loop.*GLOBAL_MEAN_OBJECTS.*pipeline.accumulation")):
      session.run([train_op, activation])


@pytest.mark.timeout(FETCH_TIMEOUT)
def test_a_tensor_in_the_micro_batch_loop_comes_back_merged():
  chosen = matrix.LAYOUTS["acc_loop"]
  for session, train_op, _, activation in _layout_session(
      "acc_loop", merge_activation=True):
    rows = session.run([train_op, activation])[1].shape[0]
    assert rows == chosen.batch * chosen.global_multiple


@pytest.mark.timeout(FETCH_TIMEOUT)
def test_micro_batches_of_a_loop_op_are_iterations_not_copies():
  for session, train_op, _, activation in _layout_session("acc_loop"):
    session.run(train_op)
    view = epl.Graph.get()
    with pytest.raises(ValueError, match=(
        r"inside the micro-batch loop.*iterations of this one op")):
      view.get_local_micro_batches(activation)


@pytest.mark.timeout(FETCH_TIMEOUT)
def test_a_summary_of_the_loss_runs_with_and_without_the_train_op():
  for layout in ("split", "pipe_1f1b"):
    for session, train_op, loss, _ in _layout_session(layout):
      summary = tf.compat.v1.summary.scalar("loss", loss)
      for run in ([train_op, summary], [summary]):
        serialized = session.run(run)[-1]
        assert tf.compat.v1.Summary.FromString(serialized).value[0].tag == (
            "loss")
