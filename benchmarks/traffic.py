"""Traffic and persistent memory per device against their formulas, per
layout: what `epl-plan` prints (epl.tools.traffic), for data parallelism
(collectives, local sums, and local sums with shared weights), a
pipeline, a split head, experts (MoE), ZeRO v1-v3 (v3 also over
collective rings) and BERT as a pipeline.

Each layout is built and rewritten on 4 logical CPU devices and counted
from the rewritten graph; nothing runs, so a standard size takes seconds.

    python benchmarks/traffic.py                 # small and standard sizes
    python benchmarks/traffic.py --sizes standard --layouts moe,zero_v3
"""
import argparse
import collections
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow.compat.v1 as tf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import epl  # noqa: E402
from benchmarks import smoke  # noqa: E402
from epl.parallel import engine  # noqa: E402
from epl.tools import traffic  # noqa: E402
from examples.bert_large import train as bert  # noqa: E402
from examples.moe import model as moe  # noqa: E402

DEVICES = 4
# The goals of issue 35: traffic at most 1.05x its formula, persistent
# memory equal to it.
TRAFFIC_GOAL = 1.05
# Size -> the shapes of every layout: an MLP (width, layers, batch per
# replica), the pipeline's micro-batches, the split head's classes, the
# experts' (groups, tokens, model, hidden, experts, capacity), BERT's
# preset and sequence.
Size = collections.namedtuple(
    "Size", "width layers batch micro_batches classes moe bert seq_length")
SIZES = collections.OrderedDict([
    ("small", Size(16, 2, 8, 2, 12, (4, 4, 8, 16, 4, 3), "tiny", 32)),
    ("standard", Size(1024, 4, 32, 4, 32000, (8, 128, 512, 2048, 8, 40),
                      "base", 128)),
])


def _batch(size, classes=None):
  """The next batch: [batch, width] features and float targets, or int64
  labels below `classes`."""
  features = tf.random.normal([size.batch, size.width], seed=1)
  if classes:
    labels = tf.random.uniform([size.batch], 0, classes, tf.int64, seed=2)
  else:
    labels = tf.random.normal([size.batch, 1], seed=3)
  return features, labels


def _mlp(hidden, size, layers):
  for index in range(layers):
    hidden = tf.layers.dense(hidden, size.width, activation=tf.nn.tanh,
                             name="layer_%d" % index)
  return hidden


def _regression(size, stages=1):
  """size.layers dense layers (their first half on stage 0 when
  `stages` is 2) and a squared error."""
  x, y = _batch(size)
  if stages == 1:
    epl.set_default_strategy(epl.replicate(device_count=1))
    return tf.reduce_mean(tf.square(tf.layers.dense(
        _mlp(x, size, size.layers), 1) - y))
  with epl.replicate(device_count=1, name="stage_0"):
    hidden = _mlp(x, size, size.layers // 2)
  stage_1 = epl.replicate(device_count=1, name="stage_1")
  epl.set_default_strategy(stage_1)
  with tf.variable_scope("stage_1"):
    prediction = tf.layers.dense(_mlp(hidden, size, size.layers // 2), 1)
  return tf.reduce_mean(tf.square(prediction - y))


def _split_head(size):
  """A data-parallel dense layer and a softmax head of size.classes
  split over the devices."""
  x, labels = _batch(size, size.classes)
  with epl.replicate(DEVICES):
    hidden = tf.layers.dense(x, size.width, activation=tf.nn.tanh)
  with epl.split(DEVICES):
    logits = tf.layers.dense(hidden, size.classes)
    return tf.losses.sparse_softmax_cross_entropy(labels, logits)


def _experts(size):
  """A dense layer, then an MoE layer whose experts are split over the
  devices."""
  groups, tokens, model, hidden, experts, capacity = size.moe
  x = tf.random.normal([groups, tokens, model], seed=1)
  y = tf.random.normal([groups, tokens, model], seed=2)
  epl.set_default_strategy(epl.replicate(DEVICES))
  x = tf.layers.dense(x, model, activation=tf.nn.tanh)
  outputs, aux_loss = moe.moe_layer(x, experts, hidden, capacity, seed=5,
                                    split_scope=epl.split(DEVICES))
  return tf.reduce_mean(tf.square(outputs - y)) + 0.01 * aux_loss


def _bert(size):
  """BERT (its preset and sequence) as 2 pipeline stages x 2 replicas, 4
  micro-batches, Adam: examples/bert_large's own graph."""
  bert.build_graph(bert.make_flags(
      config=size.bert, seq_length=size.seq_length, parallel="pipeline_data",
      num_stages=2, num_micro_batch=4, num_cpu_devices=DEVICES, steps=1))


def _zero(level, **config):
  return lambda size: dict({"zero.level": level,
                            "zero.min_partition_size": 0}, **config)


# Layout -> (build(size): the loss, or None when it builds its own train
# op; config(size): EPL's keys).
LAYOUTS = collections.OrderedDict([
    ("data_collectives", (_regression, lambda size: {
        "communication.local_cpu_reduce": False})),
    ("data_local_sums", (_regression, lambda size: {
        "communication.shared_weights": False})),
    ("data_shared_weights", (_regression, lambda size: {})),
    ("pipeline", (lambda size: _regression(size, stages=2), lambda size: {
        "pipeline.num_micro_batch": size.micro_batches})),
    ("split", (_split_head, lambda size: {
        "cluster.colocate_split_and_replicate": True})),
    ("moe", (_experts, lambda size: {
        "cluster.colocate_split_and_replicate": True})),
    ("zero_v1", (_regression, _zero("v1"))),
    ("zero_v2", (_regression, _zero("v2"))),
    ("zero_v3", (_regression, _zero("v3"))),
    # v3's gathers as CollectiveGatherV2 rings instead of local sums' one
    # concatenation per use.
    ("zero_v3_rings", (_regression, _zero(
        "v3", **{"communication.local_cpu_reduce": False}))),
    ("bert_pipeline", (_bert, None)),
])


def rewrite(layout, size):
  """The RewriteResult of `layout` at `size` (Momentum for the models
  built here), built and rewritten without a run."""
  build, config = LAYOUTS[layout]
  graph = tf.Graph()
  if config is not None:
    epl.init(epl.Config(dict({"cluster.num_cpu_devices": DEVICES},
                             **config(size))))
  with graph.as_default():
    loss = build(size)
    if loss is not None:
      tf.train.MomentumOptimizer(0.01, 0.9).minimize(loss)
    result = engine.ensure_rewritten(graph)
  return result


def _ratio(value):
  return "-" if value is None else "%.3f" % value


def _goal(ratio, limit):
  """Whether measured/formula `ratio` meets the issue's goal (at most
  `limit`)."""
  if ratio is None:
    return "-"
  return "meets" if ratio <= limit else "above"


def rows(layout, size_name, result):
  """Table rows of `result`: one per kind of traffic, then the
  persistent bytes."""
  counts = traffic.count(result)
  devices = len(counts)
  found = []
  for row in traffic.compare(result, counts):
    found.append((size_name, layout, row.kind, row.formula,
                  "%.0f" % (row.measured / devices),
                  "%.0f" % (row.expected / devices) if row.expected else "-",
                  _ratio(row.ratio), _ratio(row.worst),
                  # Handed over in memory: no bytes move.
                  "no copy" if row.kind == traffic.SHARED_READ
                  else _goal(row.ratio, TRAFFIC_GOAL)))
  held = traffic.persistent(result)
  measured = sum(m for _, m, _ in held)
  expected = sum(f for _, _, f in held)
  worst = max(m / f for _, m, f in held if f) if expected else None
  found.append((size_name, layout, "persistent",
                "shared weights" if traffic.shares_weights(result) else
                "ZeRO %s" % (result.plan.decisions.zero.value.value or "off"),
                "%.0f" % (measured / len(held)),
                "%.0f" % (expected / len(held)),
                _ratio(measured / expected if expected else None),
                _ratio(worst),
                _goal(measured / expected if expected else None, 1)))
  return found


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default=",".join(SIZES))
  parser.add_argument("--layouts", default=",".join(LAYOUTS))
  args = smoke.parse_args(parser, argv, ["--sizes", "small", "--layouts",
                                         "data_local_sums,pipeline,zero_v1"])
  tf.disable_eager_execution()
  logging.getLogger("epl").setLevel(logging.WARNING)
  print("Bytes each device sends per step (received alike) and holds, "
        "counted from the rewritten graph (epl.tools.traffic), against "
        "each layout's formula; %d logical CPU devices; TensorFlow %s. "
        "measured/formula: 1.000 is the formula, lower is better; the "
        "worst device's ratio beside it; goal: traffic at most %.2fx the "
        "formula, persistent bytes equal to it." % (
            DEVICES, tf.__version__, TRAFFIC_GOAL))
  table = [("size", "layout", "kind", "formula", "sent/device",
            "formula/device", "measured/formula", "worst device",
            "goal")]
  for size_name in args.sizes.split(","):
    for layout in args.layouts.split(","):
      table.extend(rows(layout, size_name,
                        rewrite(layout, SIZES[size_name])))
      epl.shutdown()
  print("\n".join(traffic.table(table)))


if __name__ == "__main__":
  main()
