"""auto.auto_parallel: a model with no strategy annotation is cut into
pipeline.num_stages stages by EPL (epl.parallel.plan.auto).

- Unannotated MLP and tiny BERT with 1, 2 and 4 stages train exactly like
  single-device TensorFlow on the same global batch (weights within 1e-5
  after 5 steps).
- Stages fall between layers (BERT: between encoder layers), variables
  live with the stage of their ops, and the stages' FLOPs are balanced
  (most/fewest bounded); the cut follows FLOPs, not op counts.
- A Keras optimizer (gradients from a GradientTape, its own variables
  made after the cut) trains too.
- Strategy scopes (or a default strategy) with auto parallel are an error.
"""
import os
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

import epl
from epl.ir.graph_state import state_of
from epl.parallel import engine
from epl.parallel.plan import auto
from tests import training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from examples.bert_large import train as bert  # noqa: E402  pylint: disable=wrong-import-position

STEPS = 5
GLOBAL_BATCH = 16
MLP_LAYERS = 8


def _auto_config(num_stages, devices, micro_batches=2):
  config = {"auto.auto_parallel": True, "cluster.num_cpu_devices": devices,
            "pipeline.num_micro_batch": micro_batches}
  if num_stages is not None:
    config["pipeline.num_stages"] = num_stages
  return config


def mlp(x, widths=(32,) * MLP_LAYERS):
  """Unannotated dense layers `dense`, `dense_1`, ... (tanh), then one
  output unit."""
  hidden = x
  for index, width in enumerate(widths):
    hidden = tf.compat.v1.layers.dense(
        hidden, width, activation=tf.nn.tanh,
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
            seed=20 + index))
  return tf.compat.v1.layers.dense(
      hidden, 1,
      kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=19))


@pytest.fixture(scope="module")
def mlp_single_device():
  epl.shutdown()
  values, _, _ = training.train(mlp, steps=STEPS, batch_size=GLOBAL_BATCH,
                                with_epl=False)
  return values


@pytest.mark.parametrize("num_stages, devices", [
    (None, 2), (2, 4), (4, 4)])
def test_mlp_equals_single_device(mlp_single_device, num_stages, devices):
  stages = num_stages or 1
  replicas = devices // stages
  micro_batches = 1 if stages == 1 else 2
  values, _, graph = training.train(
      mlp, steps=STEPS, batch_size=GLOBAL_BATCH // (replicas * micro_batches),
      config=_auto_config(num_stages, devices, micro_batches),
      default_strategy=False)
  training.assert_close(values, mlp_single_device)
  plan = engine.ensure_rewritten(graph).plan
  assert (plan.num_stages, plan.num_replicas) == (stages, replicas)
  choice = auto.stages_of(graph)
  assert len(choice.stages) == stages
  if stages == 1:
    assert choice.method == "data parallel" and not choice.cuts
    return
  # Cuts fall between layers: each stage starts with a layer's MatMul.
  assert all(re.fullmatch(r"dense_\d+/MatMul", cut) for cut in choice.cuts), (
      choice.cuts)
  # Each layer's variables live on the device of its ops.
  for index in range(MLP_LAYERS + 1):
    scope = "dense_%d" % index if index else "dense"
    kernel = graph.get_operation_by_name(scope + "/kernel").device
    assert kernel == graph.get_operation_by_name(scope + "/MatMul").device
    assert kernel == graph.get_operation_by_name(scope + "/bias").device
  # Equal layers (the first and last are smaller): balanced FLOPs.
  assert choice.flops_ratio <= {2: 1.3, 4: 1.6}[stages], choice.flops_ratio


@pytest.mark.parametrize("devices", [2, 4])
def test_mlp_interleaved_cuts_num_stages_times_virtual_stages(
    mlp_single_device, devices):
  # pipeline.num_stages 2 devices per pipeline, 2 stages on each: 4 stages
  # cut, stage s on pipeline device s mod 2 of its replica.
  replicas, micro_batches = devices // 2, 2
  config = dict(_auto_config(2, devices, micro_batches),
                **{"pipeline.virtual_stages": 2})
  values, _, graph = training.train(
      mlp, steps=STEPS, batch_size=GLOBAL_BATCH // (replicas * micro_batches),
      config=config, default_strategy=False)
  training.assert_close(values, mlp_single_device)
  plan = engine.ensure_rewritten(graph).plan
  assert (plan.num_stages, plan.virtual_stages, plan.num_replicas) == (
      4, 2, replicas)
  choice = auto.stages_of(graph)
  assert len(choice.stages) == 4
  assert all(re.fullmatch(r"dense_\d+/MatMul", cut) for cut in choice.cuts), (
      choice.cuts)
  for replica in range(replicas):
    prefix = "EPL_REPLICA_%d/" % replica if replica else ""
    for stage in choice.stages:
      matmuls = [name for name in stage.ops if name.endswith("/MatMul")]
      assert matmuls, stage
      for name in matmuls:
        device = graph.get_operation_by_name(prefix + name).device
        assert device.endswith("CPU:%d" % (2 * replica + stage.index % 2)), (
            name, device)


def test_mlp_zero_bubble_v_cuts_twice_the_devices_in_a_v(mlp_single_device):
  # pipeline.num_stages 2 devices under ZB-V: 4 stages cut, stage s and
  # 3 - s on device s.
  config = dict(_auto_config(2, 2, 4),
                **{"pipeline.strategy": "ZeroBubbleV"})
  values, _, graph = training.train(
      mlp, steps=STEPS, batch_size=GLOBAL_BATCH // 4, config=config,
      default_strategy=False)
  training.assert_close(values, mlp_single_device)
  plan = engine.ensure_rewritten(graph).plan
  assert (plan.num_stages, plan.virtual_stages) == (4, 2)
  for stage in auto.stages_of(graph).stages:
    for name in [n for n in stage.ops if n.endswith("/MatMul")]:
      assert graph.get_operation_by_name(name).device.endswith(
          "CPU:%d" % min(stage.index, 3 - stage.index)), name


def test_interleaved_needs_several_devices_per_pipeline():
  with pytest.raises(ValueError, match="2 stages per device .*needs "
                     "pipeline.num_stages > 1"):
    _build_only(mlp, -1, 2, **{"pipeline.virtual_stages": 2})


def _train_keras(batch_size, config=None):
  """The MLP under a Keras optimizer (minimize with a callable: the
  gradients come from a GradientTape, and the optimizer makes its step
  count variable after the cut)."""
  if config is not None:
    epl.init(epl.Config(config))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(batch_size)
    optimizer = tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9)
    train_op = optimizer.minimize(
        lambda: tf.reduce_mean(tf.square(mlp(x) - y)),
        var_list=tf.compat.v1.trainable_variables)
    values = training.run_steps(graph, train_op, STEPS)
  epl.shutdown()
  return values


@pytest.mark.tf2_behaviour_only(
    reason="GradientTape cannot differentiate reference variables (plain "
    "TensorFlow raises: RefVariable has no _id)")
@pytest.mark.parametrize("num_stages", [None, 2])
def test_keras_optimizer_through_a_gradient_tape(num_stages):
  replicas = 2 // (num_stages or 1)
  expected = _train_keras(GLOBAL_BATCH)
  actual = _train_keras(GLOBAL_BATCH // (replicas * 2),
                        _auto_config(num_stages, 2, micro_batches=2))
  training.assert_close(actual, expected)


def _build_only(model, num_stages, devices, **extra):
  """Builds `model`'s training step under auto parallel (no session),
  with config keys `extra` too; returns (graph, AutoStages)."""
  epl.init(epl.Config(dict(_auto_config(num_stages, devices), **extra)))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(8)
    loss = tf.reduce_mean(tf.square(model(x) - y))
    tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
  return graph, auto.stages_of(graph)


def test_stages_follow_flops_not_op_counts():
  # Layers with as many ops each but very different FLOPs: the second
  # (64 x 64) is 8 times the first and 64 times each later one. Equal op
  # counts would cut after four layers; equal FLOPs cut after the big one.
  def model(x):
    return mlp(x, widths=(64, 64, 8, 8, 8, 8, 8, 8))
  graph, choice = _build_only(model, 2, 2)
  assert choice.cuts == ["dense_2/MatMul"], choice.cuts
  flops = [s.cost.flops for s in choice.stages]
  assert flops[0] > flops[1]
  # The other cut between layers would make the first stage cheaper but
  # the second much dearer than this one's first.
  assert choice.flops_ratio < 8
  assert {t.name for t in state_of(graph).taskgraphs} == {
      "auto_stage_0", "auto_stage_1"}


def test_cuts_are_balanced_then_clean():
  # Eight ops of cost 1; a cut before op 4 is "dirty" (many bytes cross).
  prefix = list(range(9))
  weights = [0.0] * 9
  weights[4] = 1.0
  positions = list(range(1, 8))
  assert auto._min_max_cost(prefix, positions, 2) == pytest.approx(4)  # pylint: disable=protected-access
  assert auto._min_max_cost(prefix, positions, 3) == pytest.approx(3)  # pylint: disable=protected-access
  # Within the balance cap the clean cut wins; past it, balance does.
  assert auto._cleanest_cuts(prefix, positions, weights, 2, 5) in ([3], [5])  # pylint: disable=protected-access
  assert auto._cleanest_cuts(prefix, positions, weights, 2, 4.2) == [4]  # pylint: disable=protected-access
  cuts = auto._cleanest_cuts(prefix, positions, weights, 3, 3)  # pylint: disable=protected-access
  assert len(cuts) == 2 and 4 not in cuts
  assert all(end - start <= 3 for start, end in zip([0] + cuts, cuts + [8]))


def test_no_near_empty_stage_when_cuts_share_the_bottleneck():
  # Six equal layers in four stages: some stage holds two layers whatever
  # the cut; the last stage must still get a layer, not only the output
  # unit and the loss.
  def model(x):
    return mlp(x, widths=(32,) * 6)
  _, choice = _build_only(model, 4, 4)
  assert choice.flops_ratio <= 2.2, [s.cost.flops for s in choice.stages]


# ------------------------------------------------------------ BERT

BERT = dict(config="tiny", num_layers=4, seq_length=32,
            max_predictions_per_seq=2, dropout=False, learning_rate=1e-3,
            warmup_steps=1, seed=5)


def _train_bert(parallel="none", check=None, **flags):
  """Trains tiny BERT STEPS steps; replica 0's trainable values by name."""
  graph = tf.Graph()
  with graph.as_default():
    handles = bert.build_graph(bert.make_flags(
        parallel=parallel, steps=STEPS, **BERT, **flags))
    if check is not None:
      check(graph, handles)
    values = training.run_steps(graph, handles["train_op"], STEPS)
  epl.shutdown()
  return values


@pytest.fixture(scope="module")
def bert_single_device():
  epl.shutdown()
  return _train_bert(batch_size=GLOBAL_BATCH // 2)


@pytest.mark.parametrize("num_stages", [2, 4])
def test_bert_equals_single_device(bert_single_device, num_stages):
  micro_batches = 2
  seen = {}

  def check(graph, handles):
    plan = engine.ensure_rewritten(graph).plan
    assert (plan.num_stages, plan.num_replicas) == (num_stages, 1)
    assert handles["global_batch_size"] == GLOBAL_BATCH // 2
    seen["choice"] = auto.stages_of(graph)
    seen["graph"] = graph

  values = _train_bert(
      "auto", check=check, batch_size=GLOBAL_BATCH // 2 // micro_batches,
      num_cpu_devices=num_stages, num_micro_batch=micro_batches,
      num_stages=num_stages)
  training.assert_close(values, bert_single_device)
  choice, graph = seen["choice"], seen["graph"]
  assert choice.method == "block boundaries"
  assert choice.blocks == ["bert/encoder/layer_%d" % i for i in range(4)]
  # Every encoder layer lies in one stage, its variables on that stage's
  # device; the cuts are at layer starts.
  layer_stages = []
  for layer in range(4):
    prefix = "bert/encoder/layer_%d/" % layer
    stages = {s.index for s in choice.stages
              if any(name.startswith(prefix) for name in s.ops)}
    assert len(stages) == 1, (layer, stages)
    layer_stages.append(stages.pop())
    kernel = graph.get_operation_by_name(
        prefix + "attention/self/query/kernel")
    assert kernel.device.endswith("CPU:%d" % layer_stages[-1])
  assert layer_stages == sorted(layer_stages)
  assert all(cut.startswith("bert/encoder/layer_") for cut in choice.cuts)
  assert choice.flops_ratio <= 1.25, choice.flops_ratio
  assert np.isfinite(choice.flops_ratio)


# ------------------------------------------------------------ errors


def test_strategy_scope_under_auto_parallel_is_an_error():
  epl.init(epl.Config(_auto_config(2, 2)))
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match="auto.auto_parallel is on"):
      with epl.replicate(device_count=1):
        pass


def test_default_strategy_under_auto_parallel_is_an_error():
  epl.init(epl.Config(_auto_config(2, 2)))
  epl.set_default_strategy(epl.replicate(device_count=1))
  with tf.Graph().as_default():
    x, y = training.input_batch(8)
    loss = tf.reduce_mean(tf.square(mlp(x) - y))
    with pytest.raises(ValueError, match="set_default_strategy"):
      tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)


def test_stage_count_must_divide_the_devices():
  with pytest.raises(ValueError, match="multiple of 3"):
    _build_only(mlp, 3, 4)
