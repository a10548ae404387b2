"""The size of the graph EPL hands TensorFlow, which TF's start-up work
(placement, grappler, partitioning) grows with."""
import collections
import re

import tensorflow as tf

import epl
from epl.parallel import engine
from tests import training

REPLICAS, MICRO_BATCHES = 8, 4
_COPY_PREFIX = re.compile(r"^(EPL_REPLICA_\d+/)?(EPL_MICRO_BATCH_\d+/)?")


def _normalized_blocks(x, blocks=4, width=16):
  """Residual blocks of a dense layer, layer normalisation and tanh: a
  transformer's op mix per trained variable, which the graph's size per
  gradient follows."""
  hidden = tf.compat.v1.layers.dense(x, width)
  for _ in range(blocks):
    update = tf.compat.v1.layers.dense(hidden, width)
    mean, variance = tf.nn.moments(update, [-1], keepdims=True)
    scale = tf.compat.v1.get_variable(
        "scale_%d" % len(tf.compat.v1.trainable_variables()), [width],
        initializer=tf.compat.v1.ones_initializer())
    hidden = hidden + tf.nn.tanh(
        scale * (update - mean) * tf.math.rsqrt(variance + 1e-6))
  return tf.compat.v1.layers.dense(hidden, 1)


def _rewritten_graph(micro_batches=MICRO_BATCHES, accumulation="copies",
                     model=training.layers_model):
  # A copy of the weights per replica in every run: shared weights (one
  # host's CPUs) apply with one micro-batch only, and would make the 8x1
  # graph a different layout from the 8x4 one it is compared with.
  epl.init(epl.Config({"cluster.num_cpu_devices": REPLICAS,
                       "pipeline.num_micro_batch": micro_batches,
                       "pipeline.accumulation": accumulation,
                       "communication.shared_weights": False}))
  epl.set_default_strategy(epl.replicate(device_count=1))
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(4)
    loss = tf.reduce_mean(tf.square(model(x) - y))
    step = tf.compat.v1.train.get_or_create_global_step()
    tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=step)
    tf.compat.v1.global_variables_initializer()
    user_ops = {op.name for op in graph.get_operations()}
    result = engine.ensure_rewritten(graph)
  return graph, user_ops, result


def test_8x4_graph_holds_one_copy_per_micro_batch_and_replica_plus_glue():
  """With pipeline.accumulation "copies", each op of a micro-batch's forward/backward pass is in the graph
  replicas x micro-batches times, but for its constants (once per
  replica), each other op of the training step once per replica, each
  shared op once; what the rewrite adds besides the
  copies (accumulation, all-reduce, schedule, variable sync) stays within
  a few ops per gradient and micro-batch, per micro-batch, and per
  variable, in each replica."""
  graph, user_ops, result = _rewritten_graph()
  micro_batches = result.copies.micro_batches
  constants = {name for name, op in micro_batches[0].items()
               if micro_batches[1][name] is op}
  per_micro_batch = set(micro_batches[0]) - constants
  per_replica = {op.name for op in result.subgraph.cloned} & user_ops
  copies = collections.Counter()
  glue = 0
  for op in graph.get_operations():
    original = _COPY_PREFIX.sub("", op.name)
    if original in user_ops:
      copies[original] += 1
    else:
      glue += 1
  assert per_micro_batch and constants and per_replica - per_micro_batch
  assert all(graph.get_operation_by_name(name).type == "Const" and
             micro_batches[m][name] is micro_batches[0][name]
             for m in range(MICRO_BATCHES) for name in constants)
  for name in user_ops:
    expected = (REPLICAS * MICRO_BATCHES if name in per_micro_batch else
                REPLICAS if name in per_replica else 1)
    assert copies[name] == expected, name
  gradients = sum(len(points) for points in result.gradient_points)
  variables = len(result.subgraph.variables)
  assert glue <= REPLICAS * (4 * gradients * MICRO_BATCHES +
                             2 * MICRO_BATCHES + 4 * variables), glue
  expected_total = (len(user_ops) + (REPLICAS * MICRO_BATCHES - 1) *
                    len(per_micro_batch) + (REPLICAS - 1) *
                    len(per_replica - per_micro_batch) + glue)
  assert len(graph.get_operations()) == expected_total


def test_8x4_loop_graph_is_at_most_1_2_times_the_8x1_graph():
  """With the default pipeline.accumulation "loop", micro-batches add a
  loop, not copies: 8 replicas x 4 micro-batches has at most 1.2x the ops
  of 8 replicas x 1 (for a model with a transformer's ops per gradient;
  the loop costs a few ops per gradient and per input), and only the
  input reads are copied per micro-batch."""
  one, _, _ = _rewritten_graph(1, "loop", _normalized_blocks)
  epl.shutdown()
  four, user_ops, _ = _rewritten_graph(MICRO_BATCHES, "loop",
                                       _normalized_blocks)
  epl.shutdown()
  copied = {_COPY_PREFIX.sub("", op.name) for op in four.get_operations()
            if "EPL_MICRO_BATCH_" in op.name}
  assert copied and all(
      four.get_operation_by_name(name).type == "IteratorGetNext"
      for name in copied & user_ops)
  ratio = len(four.get_operations()) / len(one.get_operations())
  assert ratio <= 1.2, ratio
