"""Each pass family run up to its pass by the pass manager, its artifact
checked; the plan's decisions (typed, with reasons) and the hooks a pass
declares for later."""
import pytest
import tensorflow as tf

import epl
from epl.cluster import Cluster
from epl.ir.graph_state import state_of
from epl.ir.taskgraph import TaskGraph
from epl.parallel import engine
from epl.parallel.manager import Artifact, Pass, PassError, PassManager
from epl.parallel.passes.training_subgraph import select_training_subgraph
from epl.parallel.passes.variable_sync import VariableSync
from epl.parallel.plan import planner
from epl.parallel.plan.decisions import (Buckets, Communication, LossScaling,
                                         MicroBatching, Precision, Reduction,
                                         Schedule, ZeroLevel)
from epl.tools import dry_run
from tests import training


def _graph(config, fed=False):
  """A graph of layers_model trained by Adam under EPL with `config` (2 CPU
  devices), its batch read from tf.data or fed through placeholders."""
  epl.init(epl.Config(dict({"cluster.num_cpu_devices": 2}, **config)))
  epl.set_default_strategy(epl.replicate(1))
  graph = tf.Graph()
  with graph.as_default():
    if fed:
      x = tf.compat.v1.placeholder(tf.float32, [None, training.FEATURES],
                                   name="x")
      y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
    else:
      x, y = training.input_batch(8)
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss)
  return graph


def _run_until(graph, until):
  """(context, artifacts) of the rewrite of `graph` run up to pass
  `until`."""
  with graph.as_default():
    state = state_of(graph)
    step, subgraph = select_training_subgraph(graph, state)
    ctx, _, artifacts = engine.run_passes(graph, state, step, subgraph,
                                          until=until)
  return ctx, artifacts


# ------------------------------------------------------------ the plan


def _plan(config, stages=1):
  strategies = [epl.replicate(1, name="stage_%d" % s) for s in range(stages)]
  return planner.make_plan(
      Cluster.of([], 0, "CPU", 2),
      [TaskGraph(index, s) for index, s in enumerate(strategies)],
      epl.Config(config))


def test_the_plan_decides_once_with_typed_values_and_reasons():
  decisions = _plan({"pipeline.num_micro_batch": 2}).decisions
  assert decisions.micro_batches.value is MicroBatching.LOOP
  assert decisions.precision.value is Precision.FULL
  assert decisions.loss_scaling.value is LossScaling.NONE
  assert decisions.zero.value is ZeroLevel.NONE
  assert decisions.reduction.value is Reduction.MEAN
  assert decisions.communication.value is Communication.LOCAL_SUMS
  assert decisions.buckets.value is Buckets.PER_GRADIENT
  assert decisions.max_buckets is None
  collectives = _plan({"communication.local_cpu_reduce": False,
                       "communication.max_splits": 3}).decisions
  assert collectives.communication.value is Communication.COLLECTIVES
  assert collectives.buckets.value is Buckets.FUSED
  assert collectives.max_buckets == 3
  decisions = _plan({"pipeline.num_micro_batch": 2, "zero.level": "v2",
                     "amp.level": "O1", "amp.loss_scale": 64,
                     "communication.gradients_reduce_method": "sum"}
                    ).decisions
  assert decisions.micro_batches.value is MicroBatching.COPIES
  assert decisions.micro_batches.asked is MicroBatching.LOOP
  assert "zero.level v2 sends each micro-batch's gradients" in (
      decisions.micro_batches.reason)
  assert decisions.zero.value.partitions_gradients
  assert not decisions.zero.value.partitions_weights
  assert decisions.precision.value is Precision.FLOAT16
  assert decisions.loss_scaling.value is LossScaling.FIXED
  assert decisions.loss_scale == 64
  assert decisions.reduction.value is Reduction.SUM
  pipeline = _plan({"pipeline.num_micro_batch": 4, "pipeline.strategy":
                    "ZeroBubble"}, stages=2).decisions
  assert pipeline.micro_batches.value is MicroBatching.COPIES
  assert pipeline.micro_batches.asked is None
  assert pipeline.schedule.value is Schedule.ZERO_BUBBLE
  assert pipeline.schedule.value.splits_backward
  assert _plan({"pipeline.strategy": "GPipe"}).decisions.schedule.value is (
      Schedule.PREFER_FORWARD)
  bfloat16 = _plan({"amp.level": "O1", "amp.dtype": "bfloat16"}).decisions
  assert bfloat16.precision.value is Precision.BFLOAT16
  assert bfloat16.loss_scaling.value is LossScaling.NONE


def test_the_rewrite_uses_the_plan_made_before_its_passes():
  graph = _graph({})
  with graph.as_default():
    plan = planner.plan_of(graph)
  ctx, _ = _run_until(graph, "resolve_training_ops")
  assert ctx.plan is plan and ctx.plan.decisions is not None


# ------------------------------------------------------------ pass families


def test_micro_batches_hand_on_how_they_run():
  _, artifacts = _run_until(_graph({"pipeline.num_micro_batch": 2}),
                            "clone_micro_batches")
  assert artifacts["micro_batching"].value is MicroBatching.LOOP
  assert artifacts["copies"].loop_values is not None
  # A stateless random op in the micro-batch: copies, naming the op.
  epl.init(epl.Config({"cluster.num_cpu_devices": 2,
                       "pipeline.num_micro_batch": 2}))
  epl.set_default_strategy(epl.replicate(1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(8)
    noise = tf.random.stateless_normal(tf.shape(x), seed=[1, 2],
                                       name="noise")
    loss = tf.reduce_mean(tf.square(training.layers_model(x + noise) - y))
    tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
  _, artifacts = _run_until(graph, "clone_micro_batches")
  decision = artifacts["micro_batching"]
  assert decision.value is MicroBatching.COPIES
  assert decision.asked is MicroBatching.LOOP
  assert "'noise" in decision.reason and "stateless" in decision.reason
  assert decision.describe().startswith("copies (asked: loop), because op ")


def test_zero_partition_is_the_plans_level():
  _, artifacts = _run_until(_graph({"zero.level": "v1"}), "place_updates")
  partition = artifacts["zero_partition"]
  assert partition.level is ZeroLevel.V1 and partition.reduces_to_owners
  assert sorted(set(partition.owner.values())) == [0, 1]
  assert partition.weights is None
  _, artifacts = _run_until(_graph({"zero.level": "v3",
                                    "zero.min_partition_size": 1}),
                            "partition_weights")
  weights = artifacts["zero_partition"].weights
  assert {v.name for _, v in weights.points} == {
      "dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"}


def test_fed_batches_are_the_passes_artifact():
  _, artifacts = _run_until(_graph({"pipeline.num_micro_batch": 2},
                                   fed=True), "split_fed_batches")
  assert artifacts["fed_batch_parts"] == {"x:0": (4, 2, 2), "y:0": (4, 2, 2)}


def test_variable_sync_is_handed_on_with_its_substitutes():
  _, artifacts = _run_until(_graph({}), "sync_variables")
  assert isinstance(artifacts["variable_sync"], VariableSync)
  assert artifacts["split_variables"] == {}


def test_split_hands_on_its_sharded_variables():
  epl.init(epl.Config({"cluster.num_cpu_devices": 2,
                       "cluster.colocate_split_and_replicate": True}))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(8)
    with epl.replicate(2):
      hidden = tf.compat.v1.layers.dense(x, 16, activation=tf.nn.tanh,
                                         name="backbone")
    with epl.split(2):
      logits = tf.compat.v1.layers.dense(hidden, 8, name="head")
      labels = tf.cast(tf.reshape(y, [-1]) > 0, tf.int32)
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=labels, logits=logits))
    tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
  _, artifacts = _run_until(graph, "lower_split")
  assert set(artifacts["split_variables"]) == {"head/kernel", "head/bias"}
  assert {v.group_size for v in artifacts["split_variables"].values()} == {2}


# ------------------------------------------------------------ later hooks


def _make(ctx):  # pylint: disable=unused-argument
  return {"made": 1}


def test_a_later_hook_takes_only_its_passes_artifacts():
  manager = PassManager([Artifact("made", "int", "A number."),
                         Artifact("other", "int", "Another.")],
                        given=("other",))

  def grown(ctx, other):  # pylint: disable=unused-argument
    return None
  with pytest.raises(PassError, match="on_new_ops hook grown takes other, "
                     "which the pass neither reads nor writes"):
    manager.register(Pass("make", _make, writes=("made",),
                          on_new_ops=grown))
  seen = []

  def fed(ctx, feed_dict, made):  # pylint: disable=unused-argument
    seen.append((feed_dict, made))
  manager.register(Pass("make", _make, writes=("made",), on_feed=fed))
  manager.run_later("on_feed", type("Ctx", (), {"config": None})(),
                    {"made": 3, "other": 0}, {"x": 1})
  assert seen == [({"x": 1}, 3)]


def test_the_graph_state_keeps_only_what_capture_records():
  graph = _graph({})
  with graph.as_default():
    result = engine.ensure_rewritten(graph)
  state = state_of(graph)
  for moved in ("zero_weights", "fed_batch_parts", "plan_cache",
                "checked_fetches", "version_without_step"):
    assert not hasattr(state, moved)
  assert not hasattr(state.split, "rewritten")
  assert state.rewrite_result is result
  assert result.artifacts["fed_batch_parts"] == {}


def test_epl_plan_prints_each_decision():
  graph = _graph({"pipeline.num_micro_batch": 2, "zero.level": "v2"})
  with graph.as_default():
    result = engine.ensure_rewritten(graph)
  text = dry_run.describe(result)
  assert ("    micro-batches: copies (asked: loop), because zero.level v2 "
          "sends each micro-batch's gradients to their owner replica") in text
  assert "    zero: v2, because zero.level is 'v2'" in text
  assert "    precision: float32, because amp.level is not set" in text
