"""The BERT example (examples/bert_large) under EPL.

- The training graph builds and rewrites for every configuration (tiny in
  every parallel mode, checked with the equivalence runs; base and large
  build only, never initialised).
- A short tiny run trains (the loss falls) in every parallel mode, through
  the example's own driver (`train.run`, MonitoredTrainingSession).
- Data parallel, 2-stage pipeline and pipeline + data parallel BERT equal
  single-device BERT on the same global batch (dropout off): weights within
  1e-5 after a few steps.
"""
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import epl
from epl.ir.graph_state import state_of
from epl.parallel import engine
from epl.parallel.passes.context import Copies
from epl.parallel.plan.decisions import Weights
from tests import tolerance
from tests import training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from examples.bert_large import train  # noqa: E402  pylint: disable=wrong-import-position

# Small and exact: with 2 masked positions out of >= 13 candidates every
# sequence has exactly 2 (weights all 1), so the mean of the micro-batch /
# replica MLM losses is the MLM loss of the whole batch.
EXACT = dict(config="tiny", seq_length=32, max_predictions_per_seq=2,
             dropout=False, learning_rate=1e-3, warmup_steps=1, seed=5)
STEPS = 3
GLOBAL_BATCH = 8


def _state(graph):
  return state_of(graph)


def _build_and_rewrite(**flags):
  graph = tf.Graph()
  with graph.as_default():
    handles = train.build_graph(train.make_flags(**flags))
    result = engine.ensure_rewritten(graph)
  return graph, handles, result


def _device_of(graph, name):
  return graph.get_operation_by_name(name).device


# ------------------------------------------------------------ graph builds


@pytest.mark.parametrize("config, stages, layers_on_first", [
    ("base", 4, 3),
    ("large", 2, 12),
])
def test_base_and_large_build_as_pipelines(config, stages, layers_on_first):
  # Build and rewrite only: BERT-Large has 336M parameters, nothing here
  # initialises them.
  graph, handles, result = _build_and_rewrite(
      config=config, parallel="pipeline", num_stages=stages,
      num_cpu_devices=stages, num_micro_batch=1)
  assert result.plan.num_stages == stages
  assert handles["bert_config"].num_hidden_layers == stages * layers_on_first
  layer = "bert/encoder/layer_%d/attention/self/query/kernel"
  for index in range(handles["bert_config"].num_hidden_layers):
    assert _device_of(graph, layer % index).endswith(
        "CPU:%d" % (index // layers_on_first)), index
  assert _device_of(graph, "cls/seq_relationship/output_weights").endswith(
      "CPU:%d" % (stages - 1))


def test_micro_batches_schedule_and_stages_from_epl_config(monkeypatch):
  monkeypatch.setenv("EPL_PIPELINE_NUM_MICRO_BATCH", "3")
  monkeypatch.setenv("EPL_PIPELINE_STRATEGY", "PreferForward")
  monkeypatch.setenv("EPL_PIPELINE_NUM_STAGES", "4")
  graph = tf.Graph()
  with graph.as_default():
    handles = train.build_graph(train.make_flags(
        config="tiny", num_layers=4, parallel="pipeline_data",
        num_cpu_devices=8))
  assert handles["flags"].num_micro_batch == 3
  assert handles["flags"].schedule == "PreferForward"
  assert handles["flags"].num_stages == 4
  assert len(_state(graph).taskgraphs) == 4
  assert handles["global_batch_size"] == 2 * 3 * 8
  # Flags win over the environment.
  epl.shutdown()
  with tf.Graph().as_default():
    handles = train.build_graph(train.make_flags(
        config="tiny", parallel="pipeline", num_cpu_devices=2,
        num_micro_batch=2, schedule="PreferBackward", num_stages=2))
  assert epl.Env.get().config.pipeline.num_micro_batch == 2
  assert epl.Env.get().config.pipeline.strategy == "PreferBackward"
  assert epl.Env.get().config.pipeline.num_stages == 2
  assert handles["global_batch_size"] == 2 * 8


def test_replica_op_names_follow_growing_clone_maps():
  # replica_op_names is cached (rebuilding it per gradient made the rewrite
  # of BERT quadratic); passes that add ops to a replica must still see them.
  graph = tf.Graph()
  with graph.as_default():
    a, b, c = (tf.no_op(name=n) for n in "abc")
  copies = Copies([{"a": a}])
  assert copies.replica_op_names(0) == {"a"}
  copies.clones[0].update({"b": b, "c": c})
  assert copies.replica_op_names(0) == {"a", "b", "c"}


# ------------------------------------------------------------ training


@pytest.mark.parametrize("parallel, devices, micro, schedule", [
    ("data", 2, 1, ""),
    ("pipeline", 2, 2, "PreferForward"),
    ("pipeline_data", 4, 2, "PreferBackward"),
])
def test_tiny_trains_in_every_mode(parallel, devices, micro, schedule,
                                   tmp_path):
  flags = dict(
      config="tiny", parallel=parallel, num_cpu_devices=devices,
      num_micro_batch=micro, schedule=schedule, num_stages=2, batch_size=8,
      seq_length=32, steps=20, learning_rate=2e-3, warmup_steps=2,
      log_every=10, seed=3)
  # One mode also writes checkpoints and summaries, and resumes.
  model_dir = str(tmp_path) if parallel == "pipeline" else ""
  result = train.run(train.make_flags(model_dir=model_dir, **flags))
  losses = result["losses"]
  assert len(losses) == 20 and np.isfinite(losses).all()
  assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.3, losses
  assert result["global_batch_size"] == 8 * micro * (devices // (
      1 if parallel == "data" else 2))
  if model_dir:
    assert tf.train.latest_checkpoint(model_dir).endswith("-20")
    assert tf.io.gfile.glob(os.path.join(model_dir, "events.out.tfevents.*"))
    epl.shutdown()
    flags["steps"] = 23
    resumed = train.run(train.make_flags(model_dir=model_dir, **flags))
    # Three more steps from the restored weights: the loss goes on from
    # where it was, not from the initial loss.
    assert resumed["steps"] == 3
    assert resumed["losses"][0] < np.mean(losses[:5]) - 0.3, resumed
    assert tf.train.latest_checkpoint(model_dir).endswith("-23")


# ------------------------------------------------------------ equivalence


def _check_tiny_graph(graph, handles, replicas, stages, micro):
  """The plan and placement of a rewritten tiny BERT graph."""
  plan = engine.ensure_rewritten(graph).plan
  assert (plan.num_replicas, plan.num_stages, plan.num_micro_batch) == (
      replicas, stages, micro)
  assert handles["num_replicas"] == replicas
  state = _state(graph)
  if stages == 2:
    # Each part enters a fresh `stage_<s>` scope (input and embeddings,
    # every layer, heads: stage_0 three times, stage_1 twice); scopes of one
    # name make one TaskGraph.
    assert [t.name for t in state.taskgraphs] == ["stage_0", "stage_1"]
    layer = "bert/encoder/layer_%d/output/dense/kernel"
    assert _device_of(graph, "bert/embeddings/word_embeddings").endswith(
        "CPU:0")
    assert _device_of(graph, layer % 0).endswith("CPU:0")
    assert _device_of(graph, layer % 1).endswith("CPU:1")
    assert _device_of(graph, "cls/predictions/output_bias").endswith("CPU:1")
    assert _device_of(graph, "EPL_MICRO_BATCH_1/total_loss").endswith("CPU:1")
  if replicas == 2 and plan.decisions.weights.value is Weights.SHARED:
    # Data parallel on one process's CPUs: one copy every replica reads.
    assert "EPL_REPLICA_1/cls/predictions/output_bias" not in {
        op.name for op in graph.get_operations()}
  elif replicas == 2:
    assert _device_of(graph, "EPL_REPLICA_1/cls/predictions/output_bias") == (
        plan.devices[1][-1])
  # The word-embedding table is read by the gather (IndexedSlices gradient)
  # and by the tied MLM output layer (dense): tf.gradients sums the two into
  # one dense gradient, so nothing sparse reaches the all-reduce.
  grads = {v.name: g for g, v in state.gradient_records[0].pairs}
  table_grad = grads["bert/embeddings/word_embeddings"]
  assert isinstance(table_grad, tf.Tensor), type(table_grad)


def _train_exact(parallel="none", batch_size=GLOBAL_BATCH, check=None,
                 **flags):
  """Trains STEPS steps; (replica 0's trainable values, losses, values of
  the last replica's copies keyed by the original name, initial values).
  `check(graph, handles)` runs after the rewrite, before training."""
  graph = tf.Graph()
  with graph.as_default():
    handles = train.build_graph(train.make_flags(
        parallel=parallel, batch_size=batch_size, steps=STEPS, **EXACT,
        **flags))
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    init = tf.compat.v1.global_variables_initializer()
    if check is not None:
      check(graph, handles)
    with tf.compat.v1.Session() as session:
      session.run(init)
      initial = training.read_variables(session, graph, names)
      losses = [session.run([handles["train_op"], handles["loss"]])[1]
                for _ in range(STEPS)]
      values = training.read_variables(session, graph, names)
      replicas = handles["num_replicas"]
      copies = {}
      if replicas > 1:
        # The last replica's own copies (replica 0's with shared weights).
        own = {n: training.replica_copies(graph, n, replicas)[-1]
               for n in names}
        read = training.read_variables(session, graph, list(own.values()))
        copies = {n: read[c] for n, c in own.items()}
  epl.shutdown()
  return values, losses, copies, initial


@pytest.fixture(scope="module")
def single_device():
  epl.shutdown()
  return _train_exact()


@pytest.mark.parametrize("parallel, devices, micro", [
    ("data", 2, 1),
    ("pipeline", 2, 2),
    ("pipeline_data", 4, 2),
])
def test_equals_single_device_on_the_same_global_batch(
    single_device, parallel, devices, micro):
  expected, expected_losses, _, initial = single_device
  stages = 1 if parallel == "data" else 2
  replicas = devices // stages

  def check(graph, handles):
    _check_tiny_graph(graph, handles, replicas, stages, micro)

  values, losses, copies, _ = _train_exact(
      parallel, batch_size=GLOBAL_BATCH // (replicas * micro), check=check,
      num_cpu_devices=devices, num_micro_batch=micro, num_stages=2)
  # The loss fetched is the mean over replicas and micro-batches.
  tolerance.assert_equivalent(losses, expected_losses)
  training.assert_close(values, expected, atol=1e-5)
  if copies:
    training.assert_close(copies, values)
  # Training moved the weights much further than the tolerance (all but
  # the attention key biases, whose gradient is zero: softmax ignores a
  # shift of every score of a query).
  moved = {n: np.abs(expected[n] - initial[n]).max() for n in initial}
  still = sorted(n for n, m in moved.items() if m < 1e-3)
  assert all(n.endswith("/attention/self/key/bias") for n in still), still


@pytest.mark.parametrize("environment, micro_batches, device_of", [
    ({"EPL_PIPELINE_VIRTUAL_STAGES": "2"}, 2, lambda index: index % 2),
    ({"EPL_PIPELINE_STRATEGY": "ZeroBubbleV"}, 4,
     lambda index: min(index, 3 - index))], ids=["interleaved", "ZB-V"])
def test_two_stages_per_device_equal_single_device(monkeypatch, environment,
                                                   micro_batches, device_of):
  # 4 encoder layers in 4 stages, two per device on 2 devices (interleaved:
  # stages 0 and 2 on one, 1 and 3 on the other; ZB-V: 0 and 3, 1 and 2).
  # The gradient of each layer's output is summed with the next stage's
  # (residual connections), and tf.gradients gates it with the layer's own
  # gradients: without lifting that gate across stages, a device that runs
  # a later stage's backward before an earlier one's waits in a cycle.
  expected, expected_losses, _, _ = _train_exact(num_layers=4)
  for name, value in environment.items():
    monkeypatch.setenv(name, value)

  def check(graph, handles):
    plan = engine.ensure_rewritten(graph).plan
    assert (plan.num_stages, plan.virtual_stages, plan.num_replicas) == (
        4, 2, 1)
    layer = "bert/encoder/layer_%d/output/dense/kernel"
    for index in range(4):
      assert _device_of(graph, layer % index).endswith(
          "CPU:%d" % device_of(index))

  values, losses, _, _ = _train_exact(
      "pipeline", batch_size=GLOBAL_BATCH // micro_batches, check=check,
      num_cpu_devices=2, num_micro_batch=micro_batches, num_stages=4,
      num_layers=4)
  tolerance.assert_equivalent(losses, expected_losses)
  training.assert_close(values, expected, atol=1e-5)
