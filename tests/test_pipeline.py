"""Pipeline parallelism and gradient accumulation train like single-device
TensorFlow on the same global batch; schedules, placement, outputs, errors.
"""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import epl
from epl.ir.graph_state import state_of
from epl.ir.op_types import VARIABLE_READ_TYPES
from epl.parallel.passes import schedule
from epl.parallel.plan import pipeline_order
from epl.tools import schedule_simulator
from epl.tools import timeline
from tests import tolerance
from tests import training

MICRO = 8
F, B = "forward", "backward"


def _config(stages, micro_batches, replicas=1, strategy="PreferBackward",
            **extra):
  config = {"cluster.num_cpu_devices": stages * replicas,
            "pipeline.num_micro_batch": micro_batches,
            "pipeline.strategy": strategy}
  config.update(extra)
  return config


def _widths(stages):
  return (16,) * (stages - 1) + (1,)


def _check_pipeline(stages, micro_batches, replicas=1, optimizer="momentum",
                    strategy="PreferBackward", use_scopes=True, **extra):
  model = training.staged_model(_widths(stages), use_scopes=use_scopes)
  expected, _, _ = training.train(
      model, optimizer, batch_size=MICRO * micro_batches * replicas,
      with_epl=False)
  actual, _, graph = training.train(
      model, optimizer, batch_size=MICRO, default_strategy=False,
      config=_config(stages, micro_batches, replicas, strategy, **extra))
  training.assert_close(actual, expected)
  assert actual["global_step"] == 5  # one update per sess.run
  return graph


# ------------------------------------------------------------ equivalence


@pytest.mark.parametrize("strategy, optimizer", [
    ("PreferForward", "momentum"), ("PreferBackward", "momentum"),
    ("PreferForward", "adam"), ("PreferBackward", "adam"),
    ("ZeroBubble", "momentum"), ("ZeroBubble", "adam")])
def test_two_stages_four_micro_batches(strategy, optimizer):
  graph = _check_pipeline(2, 4, optimizer=optimizer, strategy=strategy)
  for m in range(1, 4):
    clone = graph.get_operation_by_name(
        "EPL_MICRO_BATCH_%d/layer_1/MatMul" % m)
    assert clone.device.endswith("CPU:1")


@pytest.mark.parametrize("strategy, optimizer", [
    ("PreferBackward", "adam"), ("ZeroBubble", "adam"),
    ("ZeroBubble", "momentum")])
def test_four_stages_on_four_devices(strategy, optimizer):
  graph = _check_pipeline(4, 4, optimizer=optimizer, strategy=strategy)
  for stage in range(4):
    kernel = graph.get_operation_by_name("layer_%d/kernel" % stage)
    assert kernel.device.endswith("CPU:%d" % stage)


@pytest.mark.parametrize("strategy, optimizer, intra_node", [
    ("PreferBackward", "momentum", True), ("PreferForward", "adam", False),
    ("ZeroBubble", "momentum", False)])
def test_two_stages_two_replicas_on_four_devices(strategy, optimizer,
                                                 intra_node):
  graph = _check_pipeline(
      2, 2, replicas=2, optimizer=optimizer, strategy=strategy,
      **{"cluster.device_place_prefer_intra_node": intra_node})
  # Replica 1's stages: devices 2 and 3 when a replica's stages stay
  # together (intra-node), else devices 1 and 3 (stage s of every replica
  # together).
  first, second = (2, 3) if intra_node else (1, 3)
  assert graph.get_operation_by_name(
      "EPL_REPLICA_1/layer_0/kernel").device.endswith("CPU:%d" % first)
  assert graph.get_operation_by_name(
      "EPL_REPLICA_1/EPL_MICRO_BATCH_1/layer_1/MatMul").device.endswith(
          "CPU:%d" % second)


def test_stages_set_by_switching_the_default_strategy():
  _check_pipeline(3, 2, use_scopes=False)


@pytest.mark.parametrize("strategy", ["PreferForward", "PreferBackward"])
def test_gradient_accumulation_with_one_stage(strategy):
  expected, _, _ = training.train(optimizer="adam", batch_size=4 * MICRO,
                                  with_epl=False)
  actual, _, _ = training.train(
      optimizer="adam", batch_size=MICRO,
      config=_config(1, 4, strategy=strategy))
  training.assert_close(actual, expected)
  assert actual["global_step"] == 5


def test_summed_gradients_over_micro_batches_and_replicas():
  # Summing 2 micro-batches x 2 replicas of mean-loss gradients equals the
  # gradient of 4 x the global mean loss.
  model = training.staged_model(_widths(2))
  expected, _, _ = training.train(model, batch_size=4 * MICRO, loss_scale=4,
                                  with_epl=False)
  actual, _, _ = training.train(
      model, batch_size=MICRO, default_strategy=False,
      config=_config(2, 2, replicas=2,
                     **{"communication.gradients_reduce_method": "sum"}))
  training.assert_close(actual, expected)


def _train_two_stages(first, second, make_train_op, batch_size,
                      config=None, static_batch=False):
  """Trains 5 steps of `second(first(x), y) -> loss` in a
  MonitoredTrainingSession; with `config`, under EPL with the two functions
  in stages "stage_0" and "stage_1" and `make_train_op(loss)` built outside
  every scope with no default strategy (as the BERT example does). With
  `static_batch`, the batch size is in the input's static shape. Returns
  the trained variables by name."""
  if config is not None:
    epl.init(epl.Config(config))
  scope = (lambda i: epl.replicate(1, name="stage_%d" % i)) if config \
      else (lambda i: _Nothing())
  with tf.Graph().as_default():
    x, y = training.input_batch(batch_size, static_batch=static_batch)
    with scope(0):
      hidden = first(x)
    with scope(1):
      loss = second(hidden, y)
    train_op = make_train_op(loss)
    reads = {v.op.name: v.read_value()
             for v in tf.compat.v1.trainable_variables()}
    with tf.compat.v1.train.MonitoredTrainingSession() as session:
      for _ in range(5):
        session.run(train_op)
      return session.run(reads)


class _Nothing:
  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    return False


def _dense_first(x):
  return tf.compat.v1.layers.dense(
      x, 16, activation=tf.nn.tanh,
      kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))


def _dense_loss(hidden, y):
  out = tf.compat.v1.layers.dense(
      hidden, 1,
      kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
  return tf.reduce_mean(tf.square(out - y))


def _clipped_momentum(loss):
  optimizer = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9)
  grads_and_vars = optimizer.compute_gradients(loss)
  grads, _ = tf.clip_by_global_norm([g for g, _ in grads_and_vars], 0.5)
  return optimizer.apply_gradients(zip(grads, [v for _, v in grads_and_vars]))


def test_clipping_sees_the_accumulated_gradient():
  expected = _train_two_stages(_dense_first, _dense_loss, _clipped_momentum,
                               4 * MICRO)
  actual = _train_two_stages(_dense_first, _dense_loss, _clipped_momentum,
                             MICRO, _config(2, 4))
  training.assert_close(actual, expected)


def _embedding_first(x):
  table = tf.compat.v1.get_variable(
      "table", [10, 4],
      initializer=tf.compat.v1.random_normal_initializer(seed=5))
  ids = tf.cast(tf.abs(x) * 3, tf.int32) % 10
  return tf.reduce_sum(tf.gather(table, ids), axis=1)  # IndexedSlices grad


def _adam_on_global_step(loss):
  step = tf.compat.v1.train.get_or_create_global_step()
  learning_rate = 0.01 / tf.cast(1 + step, tf.float32)  # outside the stages
  return tf.compat.v1.train.AdamOptimizer(learning_rate).minimize(
      loss, global_step=step)


@pytest.mark.parametrize("extra", [
    {}, {"communication.sparse_as_dense": True}], ids=["sparse", "dense"])
def test_embedding_gradients_over_micro_batches_and_replicas(extra):
  expected = _train_two_stages(_embedding_first, _dense_loss,
                               _adam_on_global_step, 2 * 2 * MICRO)
  actual = _train_two_stages(_embedding_first, _dense_loss,
                             _adam_on_global_step, MICRO,
                             _config(2, 2, replicas=2, **extra))
  training.assert_close(actual, expected)


def _embedding_and_dense_first(x):
  return _dense_first(_embedding_first(x))


@pytest.fixture(name="variables", params=["resource", "reference"])
def _variables(request):
  """Runs the test with resource variables, then with TF1 reference
  variables (VariableV2), as after tf.compat.v1.disable_resource_variables
  (which TF1 scripts get from disable_v2_behavior)."""
  if request.param == "reference":
    tf.compat.v1.disable_resource_variables()
  yield request.param
  tf.compat.v1.enable_resource_variables()


def test_embedding_and_dense_stage_with_a_static_batch(variables):
  # A stage mixing an embedding lookup (an IndexedSlices gradient) with a
  # dense layer, on a batch whose size is static: the embedding's gradient
  # concatenated over 3 micro-batches has 3 times the rows of one.
  expected = _train_two_stages(_embedding_and_dense_first, _dense_loss,
                               _adam_on_global_step, 3 * MICRO,
                               static_batch=True)
  actual = _train_two_stages(_embedding_and_dense_first, _dense_loss,
                             _adam_on_global_step, MICRO, _config(2, 3),
                             static_batch=True)
  assert sorted(actual) == [
      "dense/bias", "dense/kernel", "dense_1/bias", "dense_1/kernel",
      "table"], variables
  training.assert_close(actual, expected)


# ---------------------------------------------------- placement and outputs


def test_variables_slots_and_adam_powers_follow_their_stage():
  # The variable Adam colocates beta1_power with is the first by name,
  # "a_second/bias", of stage 1.
  epl.init(epl.Config(_config(2, 2)))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(MICRO)
    with epl.replicate(1, name="stage_0"):
      hidden = tf.compat.v1.layers.dense(x, 4, name="z_first")
    with epl.replicate(1, name="stage_1"):
      loss = tf.reduce_mean(tf.square(
          tf.compat.v1.layers.dense(hidden, 1, name="a_second") - y))
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      run_metadata = tf.compat.v1.RunMetadata()
      session.run(train_op, options=tf.compat.v1.RunOptions(
          trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                  run_metadata=run_metadata)

  def device(name):
    return graph.get_operation_by_name(name).device

  def update(variable):
    """Adam's update of `variable` (ResourceApplyAdam, or ApplyAdam of a
    reference variable)."""
    [op] = [op for op in graph.get_operations()
            if op.name.startswith("Adam/update_%s/" % variable) and
            op.type.endswith("ApplyAdam")]
    return op.name

  for name in ("z_first/kernel", "z_first/kernel/Adam", "z_first/bias/Adam_1",
               update("z_first/kernel")):
    assert device(name).endswith("CPU:0"), name
  for name in ("a_second/kernel", "a_second/kernel/Adam", "beta1_power",
               "beta2_power", update("a_second/bias")):
    assert device(name).endswith("CPU:1"), name
  for name in ("IteratorGetNext", "EPL_MICRO_BATCH_1/IteratorGetNext"):
    assert device(name).endswith("CPU:0"), name  # the host
  ran_on = {node.node_name: stats.device
            for stats in run_metadata.step_stats.dev_stats
            for node in stats.node_stats}
  assert ran_on[update("z_first/kernel")].endswith("CPU:0")
  assert ran_on[update("a_second/kernel")].endswith("CPU:1")


def _loss_on_rows(rows):
  """Plain TF: the staged model's loss on the first `rows` examples, with
  the initial weights."""
  with tf.Graph().as_default():
    x, y = training.input_batch(rows)
    loss = tf.reduce_mean(tf.square(training.staged_model(_widths(2))(x) - y))
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return session.run(loss)


def test_outputs_merge_over_micro_batches_and_replicas():
  global_batch = 2 * 2 * MICRO
  expected_mean = _loss_on_rows(global_batch)
  expected_first = _loss_on_rows(MICRO)
  epl.init(epl.Config(_config(2, 2, replicas=2)))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(MICRO)
    model = training.staged_model(_widths(2))
    loss = tf.reduce_mean(tf.square(model(x) - y))
    mean_loss = tf.identity(loss)
    rows = tf.shape(y)[0]
    epl.add_to_collection(mean_loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    epl.add_to_collection(rows, epl.GraphKeys.GLOBAL_SUM_OBJECTS)
    epl.add_to_collection(y, epl.GraphKeys.GLOBAL_CONCAT_OBJECTS)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      _, plain, merged, total, labels = session.run(
          [train_op, loss, mean_loss, rows, y])
  tolerance.assert_equivalent(plain, expected_first)
  tolerance.assert_equivalent(merged, expected_mean)
  assert total == global_batch
  np.testing.assert_array_equal(labels,
                                training.dataset_arrays()[1][:global_batch])
  # Batch m * replicas + r goes to micro-batch m of replica r.
  reads = ["IteratorGetNext", "EPL_REPLICA_1/IteratorGetNext",
           "EPL_MICRO_BATCH_1/IteratorGetNext",
           "EPL_REPLICA_1/EPL_MICRO_BATCH_1/IteratorGetNext"]
  for previous, read in zip(reads, reads[1:]):
    assert previous in [op.name for op in
                        graph.get_operation_by_name(read).control_inputs]
  # A micro-batch's computation starts after its last read (replica 1's),
  # so that the reads run back to back rather than behind replica 0.
  for first, last in ((reads[0], reads[1]), (reads[2], reads[3])):
    for output in graph.get_operation_by_name(first).outputs:
      for consumer in output.consumers():
        if consumer.name.startswith("EPL_MERGED_OUTPUTS"):
          continue  # built later, to fetch the batch
        assert last in [op.name for op in consumer.control_inputs], consumer.name


# --------------------------------------------------------------- schedules


def test_stage_order():
  assert pipeline_order.stage_order("PreferForward", 2, 0, 3) == [
      (F, 0), (F, 1), (F, 2), (B, 0), (B, 1), (B, 2)]
  short = pipeline_order.stage_order("PreferBackward", 4, 0, 2)
  assert short == [(F, 0), (F, 1), (B, 0), (B, 1)]
  with pytest.raises(ValueError, match="pipeline.strategy"):
    pipeline_order.stage_order("Interleaved", 2, 0, 2)


ONE_F_ONE_B = {  # 3 stages, 4 micro-batches
    0: [(F, 0), (F, 1), (F, 2), (B, 0), (F, 3), (B, 1), (B, 2), (B, 3)],
    1: [(F, 0), (F, 1), (B, 0), (F, 2), (B, 1), (F, 3), (B, 2), (B, 3)],
    2: [(F, 0), (B, 0), (F, 1), (B, 1), (F, 2), (B, 2), (F, 3), (B, 3)],
}
GPIPE = {s: [(F, m) for m in range(4)] + [(B, m) for m in range(4)]
         for s in range(3)}


def _traced_step(config, stages, tmp_path=None):
  epl.init(epl.Config(config))
  with tf.Graph().as_default():
    x, y = training.input_batch(MICRO)
    loss = tf.reduce_mean(tf.square(
        training.staged_model(_widths(stages))(x) - y))
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      _, trace = timeline.trace_step(session, train_op)
  return trace


@pytest.mark.parametrize("strategy, expected", [
    ("preferforward", GPIPE), ("PreferBackward", ONE_F_ONE_B)],
                         ids=["GPipe", "1F1B"])
def test_traced_step_follows_the_schedule(strategy, expected):
  trace = _traced_step(_config(3, 4, strategy=strategy), 3)
  simulated = schedule_simulator.simulate(
      epl.Config({"pipeline.strategy": strategy}).pipeline.strategy, 3, 4)
  for stage in range(3):
    assert trace.order(stage) == expected[stage], stage
    assert trace.order(stage) == simulated.order(stage), stage


@pytest.mark.parametrize("stages, micro_batches", [(3, 4), (4, 6)])
def test_zero_bubble_traced_order_is_the_simulators(stages, micro_batches):
  trace = _traced_step(_config(stages, micro_batches,
                               strategy="ZeroBubble"), stages)
  simulated = schedule_simulator.simulate("ZeroBubble", stages,
                                          micro_batches)
  for stage in range(stages):
    expected = simulated.order(stage)
    if stage == 0:
      # The first stage sends no gradient: its whole backward is W.
      expected = [(kind, m) for kind, m in expected if kind != B]
    assert trace.order(stage) == expected, stage
  costs = schedule_simulator.costs_from_trace(trace)
  assert costs.backward[0] == 0
  assert all(cost > 0 for cost in costs.forward + costs.weight +
             costs.backward[1:])
  assert schedule_simulator.simulate("ZeroBubble", stages, micro_batches,
                                     costs=costs).makespan > 0


def test_zero_bubble_splits_each_backward_into_input_and_weight_gradients():
  graph = _check_pipeline(2, 2, strategy="ZeroBubble")
  result = state_of(graph).rewrite_result
  by_block = schedule.blocks(result.context, result.subgraph, result.copies)
  names = {(b.stage, b.kind, b.micro_batch): {op.name for op in ops}
           for b, ops in by_block.items()}
  prefix = "EPL_MICRO_BATCH_1/gradients/layer_%d/"
  # Stage 1: B is the gradient with respect to its input (sent to stage
  # 0) and what it needs, the loss's gradient down to the MatMul's input
  # gradient; W the kernel and bias gradients and their accumulation.
  stage_1_b, stage_1_w = names[(1, B, 1)], names[(1, "weight", 1)]
  assert prefix % 1 + "MatMul_grad/MatMul" in stage_1_b
  assert prefix % 1 + "MatMul_grad/MatMul_1" in stage_1_w
  assert prefix % 1 + "BiasAdd_grad/BiasAddGrad" in stage_1_w
  assert any(n.startswith("EPL_MICRO_BATCH_ACCUMULATION/") for n in stage_1_w)
  assert not any("MatMul_grad/MatMul_1" in n or "BiasAddGrad" in n
                 for n in stage_1_b)
  # tf.gradients' gate (a NoOp waiting for both MatMuls) no longer holds
  # the input gradient back until the kernel gradient is done; it waits
  # for the input-gradient MatMul only.
  sent = graph.get_operation_by_name(
      prefix % 1 + "MatMul_grad/tuple/control_dependency")
  assert [c.name for c in sent.control_inputs] == [
      prefix % 1 + "MatMul_grad/MatMul"]
  # Stage 0 sends no gradient: no B block, everything is W.
  assert (0, B, 1) not in names
  assert prefix % 0 + "Tanh_grad/TanhGrad" in names[(0, "weight", 1)]


def test_every_replica_follows_the_schedule():
  trace = _traced_step(_config(2, 3, replicas=2), 2)
  for replica in range(2):
    assert trace.order(0, replica) == [(F, 0), (F, 1), (B, 0), (F, 2),
                                       (B, 1), (B, 2)]
    assert trace.order(1, replica) == [(F, 0), (B, 0), (F, 1), (B, 1),
                                       (F, 2), (B, 2)]


def test_chrome_trace_gantt_and_peak_memory(tmp_path):
  trace = _traced_step(_config(2, 2), 2)
  path = trace.save_chrome_trace(str(tmp_path / "step.json"))
  with open(path) as f:
    events = json.load(f)["traceEvents"]
  rows = {e["tid"]: e["args"]["name"] for e in events
          if e["name"] == "thread_name"}
  assert rows == {0: "stage 0 (replica 0) /device:CPU:0",
                  1: "stage 1 (replica 0) /device:CPU:1"}
  slices = {(e["tid"], e["name"]) for e in events if e["ph"] == "X"}
  for row in (0, 1):
    for name in ("forward 0", "forward 1", "backward 0", "backward 1",
                 "apply"):
      assert (row, name) in slices
  assert all(e["dur"] > 0 and e["cat"] in (F, B, "apply")
             for e in events if e["ph"] == "X")
  peaks = trace.peak_memory()
  assert sorted(peaks) == sorted(rows.values())
  assert all(peak > 0 for peak in peaks.values())
  pytest.importorskip("matplotlib")
  png = trace.save_gantt(str(tmp_path / "step.png"), title="2 stages")
  with open(png, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert os.path.getsize(png) > 1000


# ------------------------------------------------------------------ errors


def _run_first_step(build, devices=2, **extra):
  """Builds a model with `build(x, y) -> loss` and runs one step."""
  epl.init(epl.Config(_config(devices, 2, **extra)))
  with tf.Graph().as_default():
    x, y = training.input_batch(MICRO)
    loss = build(x, y)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)


def _dense(inputs, units, name):
  return tf.compat.v1.layers.dense(inputs, units, name=name)


def test_error_stage_consumes_a_later_stage():
  def build(x, y):
    with epl.replicate(1, name="stage_0"):
      first = _dense(x, 4, "first")
    with epl.replicate(1, name="stage_1"):
      second = _dense(first, 4, "second")
    with epl.replicate(1, name="stage_0"):
      back = _dense(second, 1, "back")
    with epl.replicate(1, name="stage_1"):
      return tf.reduce_mean(tf.square(back - y))
  with pytest.raises(ValueError, match=r"'stage_0' .*consumes 'second/"
                     r"BiasAdd:0'.*later stage 'stage_1'"):
    _run_first_step(build)


def test_error_compute_outside_every_stage():
  def build(x, y):
    with epl.replicate(1, name="stage_0"):
      hidden = _dense(x, 4, "first")
    with epl.replicate(1, name="stage_1"):
      out = _dense(hidden, 1, "second")
    return tf.reduce_mean(tf.square(out - y))  # no stage, no default
  with pytest.raises(ValueError, match="outside every stage scope.*no "
                     "default strategy"):
    _run_first_step(build)


def test_error_trained_variable_outside_every_stage():
  # Built between two stage scopes (ops built before the first scope
  # belong to the first stage).
  def build(x, y):
    with epl.replicate(1, name="stage_0"):
      hidden = tf.tanh(x)
    weights = tf.compat.v1.get_variable("outside", [training.FEATURES, 1])
    with epl.replicate(1, name="stage_1"):
      return tf.reduce_mean(tf.square(tf.matmul(hidden, weights) - y))
  with pytest.raises(ValueError, match="Variable 'outside' is trained but "
                     "was created outside every stage"):
    _run_first_step(build)


@pytest.mark.parametrize("devices, extra, message", [
    (4, {}, "4 devices do not divide into model replicas of 3"),
    (2, {}, "needs 3 device.*only 2"),
    (3, {"pipeline.num_stages": 2}, "num_stages is 2 but the model has 3")])
def test_error_stage_count_does_not_fit_the_devices(devices, extra, message):
  def build(x, y):
    hidden = x
    for stage in range(3):
      with epl.replicate(1, name="stage_%d" % stage):
        hidden = _dense(hidden, 1 if stage == 2 else 4, "layer_%d" % stage)
        if stage == 2:
          return tf.reduce_mean(tf.square(hidden - y))
  with pytest.raises(ValueError, match=message):
    _run_first_step(build, devices=devices, **extra)


# ------------------------------------------------------ interleaved 1F1B


def _interleaved_config(stages, micro_batches, replicas=1, **extra):
  """`stages` stage scopes, two per device (pipeline.virtual_stages 2)."""
  config = _config(stages // 2, micro_batches, replicas,
                   **{"pipeline.virtual_stages": 2})
  config.update(extra)
  return config


@pytest.mark.parametrize("replicas, optimizer, extra", [
    (1, "momentum", {}), (1, "adam", {}), (2, "adam", {}),
    (2, "momentum", {"cluster.device_place_prefer_intra_node": False}),
    (1, "adam", {"gradient_checkpoint.type": "auto"})],
                         ids=["momentum", "adam", "2-replicas",
                              "2-replicas-spread", "checkpointing"])
def test_interleaved_four_stages_on_two_devices_per_replica(
    replicas, optimizer, extra):
  model = training.staged_model(_widths(4))
  expected, _, _ = training.train(
      model, optimizer, batch_size=MICRO * 4 * replicas, with_epl=False)
  actual, _, graph = training.train(
      model, optimizer, batch_size=MICRO, default_strategy=False,
      config=_interleaved_config(4, 4, replicas, **extra))
  training.assert_close(actual, expected)
  assert actual["global_step"] == 5
  # Stage s on pipeline device s mod 2 of its replica: devices 2r and 2r +
  # 1 when a replica's devices stay together (intra-node), else devices r
  # and 2 + r.
  intra_node = extra.get("cluster.device_place_prefer_intra_node", True)
  for replica in range(replicas):
    prefix = "EPL_REPLICA_%d/" % replica if replica else ""
    for stage in range(4):
      kernel = graph.get_operation_by_name(prefix + "layer_%d/kernel" % stage)
      device = (2 * replica + stage % 2 if intra_node else
                stage % 2 * replicas + replica)
      assert kernel.device.endswith("CPU:%d" % device), kernel.name


def test_interleaved_traced_order_is_the_simulators():
  trace = _traced_step(_interleaved_config(4, 4), 4)
  simulated = schedule_simulator.simulate("PreferBackward", 4, 4,
                                          virtual_stages=2)
  for device in range(2):
    rows = [i for i, row in enumerate(trace.rows)
            if row.replica == 0 and row.stage % 2 == device]
    ran = sorted((s for s in trace.slices
                  if s.row in rows and s.phase != "apply"),
                 key=lambda s: s.start)
    assert [(s.phase, trace.rows[s.row].stage, s.micro_batch)
            for s in ran] == simulated.order(device), device


@pytest.mark.parametrize("stages, extra, error, message", [
    (3, {}, ValueError, "virtual_stages is 2 but the model's 3 stage"),
    (4, {"pipeline.num_micro_batch": 3}, ValueError,
     "num_micro_batch to be a multiple of 2; it is 3"),
    (4, {"pipeline.strategy": "ZeroBubble"}, ValueError,
     "interleaves 1F1B only.*'ZeroBubble'")])
def test_error_interleaved_virtual_stages(stages, extra, error, message):
  def build(x, y):
    return tf.reduce_mean(tf.square(
        training.staged_model(_widths(stages))(x) - y))
  extra = dict({"pipeline.virtual_stages": 2}, **extra)
  with pytest.raises(error, match=message):
    _run_first_step(build, devices=2, **extra)


def test_interleaved_plan_and_its_errors_with_split():
  from epl.ir.taskgraph import TaskGraph  # pylint: disable=import-outside-toplevel
  from epl.parallel.plan import planner  # pylint: disable=import-outside-toplevel
  epl.init(epl.Config(_interleaved_config(
      4, 2, **{"cluster.colocate_split_and_replicate": True})))
  env = epl.Env.get()
  plan = planner.make_plan(
      env.cluster, [TaskGraph(i, epl.replicate(1, name="stage_%d" % i))
                    for i in range(4)], env.config)
  assert plan.num_replicas == 1
  assert [plan.device(0, s) for s in range(4)] == [
      "/device:CPU:0", "/device:CPU:1", "/device:CPU:0", "/device:CPU:1"]
  assert "interleaved, 2 stages per device" in plan.describe()
  with pytest.raises(NotImplementedError, match="virtual_stages 2 with "
                     "epl.split"):
    planner.make_plan(env.cluster, [TaskGraph(0, epl.replicate(2)),
                                    TaskGraph(1, epl.split(2))], env.config)


@pytest.mark.parametrize("strategy, extra", [
    ("PreferBackward", {}), ("PreferForward", {}), ("ZeroBubble", {}),
    ("PreferBackward", {"gradient_checkpoint.type": "auto"})],
                         ids=["1F1B", "GPipe", "ZB-H1", "checkpointing"])
def test_weight_read_by_two_stages_trains_like_one_device(strategy, extra):
  # Stage 1 reads stage 0's weight once a step and sums its part of the
  # weight's gradient over the micro-batches before sending it
  # (epl.parallel.passes.cross_stage_weights); 2 replicas.
  expected, _, _ = training.train(training.tied_stages, "adam",
                                  batch_size=MICRO * 3 * 2, with_epl=False)
  actual, _, graph = training.train(
      training.tied_stages, "adam", batch_size=MICRO,
      default_strategy=False, config=_config(2, 3, 2, strategy, **extra))
  training.assert_close(actual, expected)
  # One read of replica 0's w whose value stage 1 uses: a resource
  # variable's ReadVariableOp on CPU:1, or a reference variable's Identity
  # (colocated with w) that ops on CPU:1 consume.
  reads = [op for op in graph.get_operations()
           if op.type in VARIABLE_READ_TYPES and op.inputs and
           op.inputs[0].op.name == "w" and
           any(user.device.endswith("CPU:1")
               for user in [op] + op.outputs[0].consumers())]
  assert len(reads) == 1, [op.name for op in reads]


# ------------------------------------------------------------------- ZB-V


def _v_config(devices, micro_batches, replicas=1, **extra):
  """2 x `devices` stage scopes on `devices` devices per replica, in a V
  (pipeline.strategy ZeroBubbleV)."""
  return _config(devices, micro_batches, replicas, strategy="ZeroBubbleV",
                 **extra)


@pytest.mark.parametrize("devices, replicas, optimizer, extra", [
    (2, 1, "momentum", {}), (2, 1, "adam", {}),
    (4, 1, "momentum", {"pipeline.virtual_stages": 2}),
    (2, 2, "adam", {"cluster.device_place_prefer_intra_node": False}),
    (2, 1, "adam", {"gradient_checkpoint.type": "auto"})],
                         ids=["momentum", "adam", "4-devices",
                              "2-replicas-spread", "checkpointing"])
def test_zero_bubble_v_trains_like_one_device(devices, replicas, optimizer,
                                              extra):
  stages, micro_batches = 2 * devices, 2 * devices
  model = training.staged_model(_widths(stages))
  expected, _, _ = training.train(
      model, optimizer, batch_size=MICRO * micro_batches * replicas,
      with_epl=False)
  actual, _, graph = training.train(
      model, optimizer, batch_size=MICRO, default_strategy=False,
      config=_v_config(devices, micro_batches, replicas, **extra))
  training.assert_close(actual, expected)
  assert actual["global_step"] == 5
  # Stage s and 2p - 1 - s on pipeline device s of its replica (devices
  # r and p + r... when stage s of every replica is grouped, not
  # intra-node).
  intra_node = extra.get("cluster.device_place_prefer_intra_node", True)
  for replica in range(replicas):
    prefix = "EPL_REPLICA_%d/" % replica if replica else ""
    for stage in range(stages):
      kernel = graph.get_operation_by_name(prefix + "layer_%d/kernel" % stage)
      pipeline_device = min(stage, stages - 1 - stage)
      device = (devices * replica + pipeline_device if intra_node else
                pipeline_device * replicas + replica)
      assert kernel.device.endswith("CPU:%d" % device), kernel.name
  if "gradient_checkpoint.type" in extra:
    # Stage 1's recomputed output, which W of stage 2 (the V's tip, the
    # same device) reads, runs in stage 2's B, on stage 1's device.
    result = state_of(graph).rewrite_result
    recomputed = "EPL_MICRO_BATCH_1/EPL_GRADIENT_CHECKPOINTS/layer_1/Tanh"
    [(block, op)] = [(b, op) for b, ops in schedule.blocks(
        result.context, result.subgraph, result.copies).items()
                     for op in ops if op.name == recomputed]
    assert (block.stage, block.kind) == (2, B)
    assert op.device.endswith("CPU:1")


@pytest.mark.parametrize("schedule, optimizer", [
    ("ZeroBubbleVHalf", "adam"), ("ZeroBubbleVMin", "momentum")])
def test_capped_v_trains_like_one_device(schedule, optimizer):
  # 3 devices: V-Half holds at most 5 stage-micro-batches per device,
  # V-Min 5 too (1F1B: 6).
  model = training.staged_model(_widths(6))
  expected, _, _ = training.train(model, optimizer, batch_size=MICRO * 6,
                                  with_epl=False)
  actual, _, _ = training.train(
      model, optimizer, batch_size=MICRO, default_strategy=False,
      config=_config(3, 6, strategy=schedule))
  training.assert_close(actual, expected)


def _device_order(trace, stages_of_device):
  """[(kind, stage, micro-batch)] replica 0's device ran, in time order."""
  rows = [i for i, row in enumerate(trace.rows)
          if row.replica == 0 and row.stage in stages_of_device]
  ran = sorted((s for s in trace.slices
                if s.row in rows and s.phase != "apply"),
               key=lambda s: s.start)
  return [(s.phase, trace.rows[s.row].stage, s.micro_batch) for s in ran]


@pytest.mark.parametrize("schedule, devices, micro_batches", [
    ("ZeroBubbleV", 2, 4), ("ZeroBubbleV", 3, 5),
    ("ZeroBubbleVMin", 3, 6)])
def test_zero_bubble_v_traced_order_is_the_simulators(schedule, devices,
                                                      micro_batches):
  stages = 2 * devices
  trace = _traced_step(_config(devices, micro_batches, strategy=schedule),
                       stages)
  simulated = schedule_simulator.simulate(schedule, stages, micro_batches)
  for device in range(devices):
    # The first stage sends no gradient: its whole backward is W.
    expected = [step for step in simulated.order(device)
                if step[:2] != (B, 0)]
    assert _device_order(trace, (device, stages - 1 - device)) == (
        expected), device


@pytest.mark.parametrize("stages, extra, message", [
    (3, {}, "ZB-V .*places 2 stage scopes per device in a V, but the "
     "model has 3 stage scope"),
    (4, {"pipeline.num_micro_batch": 2}, "2 devices per pipeline needs "
     "pipeline.num_micro_batch >= 3.*it is 2"),
    (4, {"pipeline.virtual_stages": 4}, "virtual_stages is 4: set it to 2")])
def test_error_zero_bubble_v(stages, extra, message):
  def build(x, y):
    return tf.reduce_mean(tf.square(
        training.staged_model(_widths(stages))(x) - y))
  extra = dict({"pipeline.strategy": "ZeroBubbleV"}, **extra)
  with pytest.raises(ValueError, match=message):
    _run_first_step(build, devices=2, **extra)
