"""Data parallelism equals single-device training on the same global batch."""
import numpy as np
import pytest
import tensorflow as tf

import epl
from tests import training

REPLICAS = 4
MICRO = 8


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
@pytest.mark.parametrize("model", [training.layers_model,
                                   training.get_variable_model,
                                   training.ref_variable_model],
                         ids=["layers", "get_variable", "ref_variables"])
def test_mean_matches_single_device(model, optimizer):
  expected, _, _ = training.train(model, optimizer, batch_size=REPLICAS * MICRO,
                                  with_epl=False)
  actual, _, _ = training.train(model, optimizer, batch_size=MICRO,
                                config={"cluster.num_cpu_devices": REPLICAS})
  training.assert_close(actual, expected)
  assert actual["global_step"] == 5


def test_reference_variable_updates_wait_for_their_reads():
  # A VariableV2 is read without a copy: the backward op that reads w2 (the
  # gradient of the hidden layer) must run before w2's update, which
  # tf.gradients + apply_gradients does not order (plain TF races; its
  # GATE_OP compute_gradients is the reference). As copies, whose
  # micro-batch 1 is its own ops (the loop's ordering is tested in
  # test_loop_accumulation).
  expected, _ = training.reference_variable_training(REPLICAS * MICRO, False)
  actual, graph = training.reference_variable_training(
      MICRO // 2, True, {"cluster.num_cpu_devices": REPLICAS,
                         "pipeline.num_micro_batch": 2,
                         "pipeline.accumulation": "copies"})
  training.assert_close(actual, expected)
  for replica in ("", "EPL_REPLICA_1/"):
    update = graph.get_operation_by_name(
        replica + "Adam/update_ref/w2/ApplyAdam")
    waits = {op.name for op in update.control_inputs}
    for micro_batch in ("", "EPL_MICRO_BATCH_1/"):
      assert replica + micro_batch + "gradients/ref/MatMul_1_grad/MatMul" in waits


def test_shared_reference_variable_update_waits_for_every_replicas_reads():
  # Shared weights: the one update of the VariableV2 w2 (read without a
  # copy) waits for the backward op of every replica that reads it.
  expected, _ = training.reference_variable_training(REPLICAS * MICRO, False)
  actual, graph = training.reference_variable_training(
      MICRO, True, {"cluster.num_cpu_devices": REPLICAS})
  training.assert_close(actual, expected)
  update = graph.get_operation_by_name("Adam/update_ref/w2/ApplyAdam")
  waits = {op.name for op in update.control_inputs}
  for replica in ["", "EPL_REPLICA_1/", "EPL_REPLICA_2/", "EPL_REPLICA_3/"]:
    assert replica + "gradients/ref/MatMul_1_grad/MatMul" in waits
  assert "EPL_REPLICA_1/Adam/update_ref/w2/ApplyAdam" not in {
      op.name for op in graph.get_operations()}


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_sum_matches_single_device_with_summed_loss(optimizer):
  # Summing the replicas' mean-loss gradients equals the gradient of
  # REPLICAS x the global mean loss.
  expected, _, _ = training.train(optimizer=optimizer,
                                  batch_size=REPLICAS * MICRO,
                                  loss_scale=REPLICAS, with_epl=False)
  actual, _, _ = training.train(
      optimizer=optimizer, batch_size=MICRO,
      config={"cluster.num_cpu_devices": REPLICAS,
              "communication.gradients_reduce_method": "sum"})
  training.assert_close(actual, expected)


def test_replicas_stay_identical_and_are_placed_on_their_devices():
  # Per-replica weights (on by default only where the replicas do not
  # share one process's memory).
  _, _, graph = training.train(config={
      "cluster.num_cpu_devices": REPLICAS,
      "communication.shared_weights": False})
  kernel = graph.get_operation_by_name("dense/kernel")
  assert kernel.device.endswith("CPU:0")
  for replica in range(1, REPLICAS):
    clone = graph.get_operation_by_name("EPL_REPLICA_%d/dense/kernel" % replica)
    assert clone.device.endswith("CPU:%d" % replica)
    # Its own variable: a resource variable by its shared_name, a
    # reference variable (shared_name empty) by its node name.
    assert (clone.get_attr("shared_name") or clone.name.encode()) != (
        kernel.get_attr("shared_name") or kernel.name.encode())


def test_shared_weights_one_copy_one_update_same_training():
  # Replicas of one process's CPUs read one copy of each variable and its
  # Adam slots, updated once per step: the same weights as one device on
  # the global batch, and no replica has a copy of its own.
  expected, _, _ = training.train(optimizer="adam",
                                  batch_size=REPLICAS * MICRO, with_epl=False)
  actual, _, graph = training.train(
      optimizer="adam", batch_size=MICRO,
      config={"cluster.num_cpu_devices": REPLICAS})
  training.assert_close(actual, expected)
  names = {op.name for op in graph.get_operations()}
  assert "dense/kernel" in names and "dense/kernel/Adam" in names
  replica_ops = [n for n in names if n.startswith("EPL_REPLICA_")]
  assert replica_ops
  assert not [n for n in replica_ops if n.endswith("dense/kernel") or
              "Adam" in n]
  plan = epl.parallel.plan.planner.plan_of(graph)
  assert plan.decisions.weights.value.name == "SHARED"
  # What epl-plan prints and the rewrite logs.
  assert any(line.startswith("weights: one copy every replica reads, "
                             "updated once per step, because every replica "
                             "is a CPU device of this process")
             for line in plan.decisions.lines(notable_only=True))


def test_fused_buckets_and_fp16_communication():
  expected, _, _ = training.train(batch_size=REPLICAS * MICRO, with_epl=False)
  actual, _, _ = training.train(
      batch_size=MICRO,
      config={"cluster.num_cpu_devices": REPLICAS,
              "communication.max_splits": 1})
  training.assert_close(actual, expected)
  half, _, _ = training.train(
      batch_size=MICRO,
      config={"cluster.num_cpu_devices": REPLICAS,
              "communication.fp16": True})
  training.assert_close(half, expected, atol=2e-3)


def test_fp16_communication_overflow_falls_back_to_float32():
  # A scale that overflows float16 (max 65504): every replica sees the
  # overflow in the reduced values and sends the bucket again as float32,
  # so training is exact instead of corrupted by inf.
  expected, _, _ = training.train(batch_size=REPLICAS * MICRO, with_epl=False)
  actual, _, _ = training.train(
      batch_size=MICRO,
      config={"cluster.num_cpu_devices": REPLICAS,
              "communication.fp16": True, "communication.fp16_scale": 1e9})
  training.assert_close(actual, expected)


def test_single_device_runs_unchanged():
  expected, _, _ = training.train(batch_size=MICRO, with_epl=False)
  actual, _, _ = training.train(batch_size=MICRO,
                                config={"cluster.num_cpu_devices": 1})
  training.assert_close(actual, expected)


def _embedding_train(with_epl, batch_size, optimizer, config=None):
  if with_epl:
    settings = {"cluster.num_cpu_devices": REPLICAS}
    settings.update(config or {})
    epl.init(epl.Config(settings))
    epl.set_default_strategy(epl.replicate(device_count=1))
  else:
    epl.shutdown()
  rng = np.random.RandomState(5)
  ids = rng.randint(0, 40, size=(256, 3)).astype(np.int32)
  targets = rng.normal(size=(256, 1)).astype(np.float32)
  graph = tf.Graph()
  with graph.as_default():
    batch_ids, batch_targets = tf.compat.v1.data.make_one_shot_iterator(
        tf.data.Dataset.from_tensor_slices((ids, targets)).repeat()
        .batch(batch_size)).get_next()
    table = tf.compat.v1.get_variable(
        "table", [40, 6],
        initializer=tf.compat.v1.random_normal_initializer(seed=7))
    w = tf.compat.v1.get_variable(
        "w", [6, 1], initializer=tf.compat.v1.random_normal_initializer(seed=8))
    pooled = tf.reduce_mean(tf.nn.embedding_lookup(table, batch_ids), axis=1)
    loss = tf.reduce_mean(tf.square(tf.matmul(pooled, w) - batch_targets))
    train_op = training.OPTIMIZERS[optimizer]().minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(5):
        session.run(train_op)
      return training.read_variables(session, graph, ["table", "w"])


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_gradients_match_single_device(optimizer, sparse_as_dense):
  expected = _embedding_train(False, REPLICAS * MICRO, optimizer)
  actual = _embedding_train(
      True, MICRO, optimizer,
      {"communication.sparse_as_dense": sparse_as_dense})
  if sparse_as_dense and optimizer == "momentum":
    # Dense momentum also decays the accumulators of rows the batch did not
    # touch, unlike the sparse update of single-device training.
    assert not np.allclose(actual["table"], expected["table"], atol=1e-5)
  else:
    training.assert_close(actual, expected)


def _ragged_embedding_model(x):
  """Looks up only the rows whose first feature is positive: a different
  number of rows in every replica's batch (a ragged IndexedSlices)."""
  table = tf.compat.v1.get_variable(
      "table", [10, 1],
      initializer=tf.compat.v1.random_normal_initializer(seed=5))
  ids = tf.cast(tf.abs(x[:, 1]) * 3.0, tf.int32) % 10
  kept = x[:, 0] > 0
  rows = tf.nn.embedding_lookup(table, tf.boolean_mask(ids, kept))
  per_row = tf.scatter_nd(tf.where(kept), rows,
                          tf.stack([tf.shape(x, out_type=tf.int64)[0], 1]))
  return training.layers_model(x) + per_row


def test_sparse_gradients_with_different_row_counts_per_replica():
  # Padded to the longest, gathered under a fresh instance key each step
  # (row counts change between steps too), padding dropped.
  for optimizer in ["sgd", "adam"]:
    expected, _, _ = training.train(_ragged_embedding_model, optimizer,
                                    batch_size=REPLICAS * MICRO,
                                    with_epl=False)
    actual, _, _ = training.train(
        _ragged_embedding_model, optimizer, batch_size=MICRO,
        config={"cluster.num_cpu_devices": REPLICAS})
    training.assert_close(actual, expected)
    epl.shutdown()


@pytest.mark.usefixtures("tf1_tensor_shapes")
def test_sparse_gradients_with_different_row_counts_and_tf1_tensor_shapes():
  # The unknown row count is Dimension(None): still gathered as ragged.
  expected, _, _ = training.train(_ragged_embedding_model, "sgd",
                                  batch_size=REPLICAS * MICRO,
                                  with_epl=False)
  actual, _, _ = training.train(
      _ragged_embedding_model, "sgd", batch_size=MICRO,
      config={"cluster.num_cpu_devices": REPLICAS})
  training.assert_close(actual, expected)
