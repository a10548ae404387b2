"""TF1 control flow (tf.while_loop, tf.cond, dynamic_rnn, raw_rnn, TF's
dynamic loss-scale optimizer, built with control flow v1 as under
`disable_v2_behavior()`) replicates, pipelines, accumulates, recomputes and
casts like any other ops: the weights match single-device TensorFlow."""
import functools

import pytest
import tensorflow as tf

import epl
from epl.ir import control_flow
from tests import training
from tests.test_amp import FP16_TOLERANCE
from tests.tolerance import EQUIVALENCE_TOLERANCE

MICRO = 8
STEPS = 4


@pytest.fixture(autouse=True)
def _control_flow_v1():
  tf.compat.v1.disable_control_flow_v2()
  yield
  tf.compat.v1.enable_control_flow_v2()


def _dense(hidden, units, seed, name, activation=None):
  return tf.compat.v1.layers.dense(
      hidden, units, activation=activation, name=name,
      kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed))


def _while_body(x):
  """Three tanh layers sharing one weight, in a tf.while_loop."""
  weight = tf.compat.v1.get_variable(
      "loop_weight", [training.FEATURES, training.FEATURES],
      initializer=tf.compat.v1.random_normal_initializer(stddev=0.3, seed=3))

  def body(step, hidden):
    return step + 1, tf.tanh(tf.matmul(hidden, weight))
  _, hidden = tf.while_loop(lambda step, _: step < 3, body,
                            [tf.constant(0), x])
  return hidden


def _cond_body(x):
  """A dense layer, then on even steps a tanh layer, on odd ones relu."""
  hidden = _dense(x, 16, 1, "cond_dense")
  weight = tf.compat.v1.get_variable(
      "branch_weight", [16, 16],
      initializer=tf.compat.v1.random_normal_initializer(stddev=0.3, seed=4))
  even = tf.equal(tf.math.floormod(
      tf.compat.v1.train.get_or_create_global_step(), 2), 0)
  return tf.cond(even, lambda: tf.tanh(tf.matmul(hidden, weight)),
                 lambda: tf.nn.relu(hidden))


def _sequence(x):
  """The features as a sequence of 4 steps of 2."""
  return tf.reshape(x, [-1, 4, 2])


def _lstm_cell():
  return tf.compat.v1.nn.rnn_cell.LSTMCell(
      8, initializer=tf.compat.v1.glorot_uniform_initializer(seed=5))


def _dynamic_rnn_body(x):
  outputs, _ = tf.compat.v1.nn.dynamic_rnn(_lstm_cell(), _sequence(x),
                                           dtype=tf.float32)
  return outputs[:, -1]


def _raw_rnn_body(x):
  """An LSTM over the sequence through tf.compat.v1.nn.raw_rnn."""
  steps = tf.transpose(_sequence(x), [1, 0, 2])
  inputs = tf.TensorArray(tf.float32, size=4).unstack(steps)
  cell = _lstm_cell()
  batch = tf.shape(x)[0]

  def loop_fn(time, output, state, loop_state):
    del loop_state
    finished = tf.fill([batch], time >= 4)
    if output is None:  # the first call: no step has run yet
      state = cell.zero_state(batch, tf.float32)
    next_input = tf.cond(time >= 4, lambda: tf.zeros([batch, 2]),
                         lambda: inputs.read(tf.minimum(time, 3)))
    next_input.set_shape([None, 2])
    return finished, next_input, state, output, None
  _, final_state, _ = tf.compat.v1.nn.raw_rnn(cell, loop_fn)
  return final_state.h


BODIES = {"while_loop": _while_body, "cond": _cond_body,
          "dynamic_rnn": _dynamic_rnn_body, "raw_rnn": _raw_rnn_body}


def _model(body, stages=False):
  """`body` then a dense head; with `stages` (under EPL), the body is
  pipeline stage 0 and the head stage 1."""
  def model(x):
    if stages and epl.Env.initialised():
      with epl.replicate(device_count=1, name="stage_0"):
        hidden = body(x)
      epl.set_default_strategy(epl.replicate(device_count=1, name="stage_1"))
    else:
      hidden = body(x)
    return _dense(hidden, 1, 2, "head")
  return model


def _check(body, config, micro_batches=1, replicas=1, stages=False,
           optimizer="momentum", atol=EQUIVALENCE_TOLERANCE["atol"]):
  """EPL with `config` trains `body` STEPS steps like single-device TF on
  the same global batch."""
  model = _model(body, stages)
  expected, _, _ = training.train(
      model, optimizer, steps=STEPS,
      batch_size=MICRO * micro_batches * replicas, with_epl=False)
  actual, _, graph = training.train(
      model, optimizer, steps=STEPS, batch_size=MICRO, config=config,
      default_strategy=not stages)
  training.assert_close(actual, expected, atol=atol)
  return graph


def _v1_ops(graph, prefix=""):
  return [op for op in graph.get_operations()
          if op.type in control_flow.V1_CONTROL_FLOW_TYPES and
          op.name.startswith(prefix)]


@pytest.mark.parametrize("body", sorted(BODIES))
def test_data_parallel(body):
  graph = _check(BODIES[body], {"cluster.num_cpu_devices": 2}, replicas=2)
  assert _v1_ops(graph, "EPL_REPLICA_1/")
  # Each replica's loop runs in a frame of its own.
  frames = {op.name: op.get_attr("frame_name")
            for op in graph.get_operations()
            if op.type in control_flow.ENTER_TYPES}
  copied = [name for name in frames if "EPL_REPLICA_1/" + name in frames]
  assert copied or not frames
  for name in copied:
    assert frames["EPL_REPLICA_1/" + name] == b"EPL_REPLICA_1/" + frames[name]


@pytest.mark.parametrize("body", sorted(BODIES))
def test_gradient_accumulation(body):
  graph = _check(BODIES[body], {"pipeline.num_micro_batch": 3},
                 micro_batches=3)
  assert _v1_ops(graph, "EPL_MICRO_BATCH_2/")


@pytest.mark.parametrize("body", sorted(BODIES))
def test_pipeline_two_stages_with_replicas(body):
  _check(BODIES[body], {"cluster.num_cpu_devices": 4,
                        "pipeline.num_micro_batch": 2},
         micro_batches=2, replicas=2, stages=True)


def test_copies_get_their_own_contexts():
  graph = _check(_while_body, {"cluster.num_cpu_devices": 2,
                               "pipeline.num_micro_batch": 2},
                 micro_batches=2, replicas=2)
  original = graph.get_operation_by_name("while/Merge_1")
  for prefix in ("EPL_MICRO_BATCH_1/", "EPL_REPLICA_1/",
                 "EPL_REPLICA_1/EPL_MICRO_BATCH_1/"):
    copy = graph.get_operation_by_name(prefix + "while/Merge_1")
    context = control_flow.while_context(copy)
    assert context is not control_flow.while_context(original)
    assert context.name == prefix + "while/while_context"
  whiles = graph.get_collection(tf.compat.v1.GraphKeys.WHILE_CONTEXT)
  assert {c.name for c in whiles} >= {
      "while/while_context", "EPL_REPLICA_1/while/while_context"}


@pytest.mark.parametrize("body", ["while_loop", "cond", "dynamic_rnn"])
def test_amp_o1_data_parallel(body):
  graph = _check(BODIES[body], {"amp.level": "O1", "amp.loss_scale": 128,
                                "cluster.num_cpu_devices": 2},
                 replicas=2, atol=FP16_TOLERANCE)
  # The loop's or branch's own ops run in half precision there.
  half = [op for op in graph.get_operations()
          if op.name.endswith("_EPL_AMP_float16") and
          control_flow.context_of(op) is not None]
  assert half
  for op in half:
    if not op.name.startswith("EPL_"):
      assert control_flow.context_of(op) is control_flow.context_of(
          graph.get_operation_by_name(op.name[:-len("_EPL_AMP_float16")]))


def _checkpointed(body):
  """`body` between dense layers; the layer before it and the second
  after it are checkpoints: the first layer after it is recomputed."""
  def model(x):
    hidden = _dense(x, training.FEATURES, 6, "before", tf.nn.tanh)
    tf.compat.v1.add_to_collection("checkpoints", hidden)
    hidden = _dense(body(hidden), 16, 7, "after", tf.nn.tanh)
    hidden = _dense(hidden, 16, 9, "after_2", tf.nn.tanh)
    tf.compat.v1.add_to_collection("checkpoints", hidden)
    return _dense(hidden, 16, 8, "last", tf.nn.tanh)
  return model


@pytest.mark.parametrize("body", ["while_loop", "cond", "dynamic_rnn"])
def test_gradient_checkpoint(body):
  graph = _check(_checkpointed(BODIES[body]),
                 {"gradient_checkpoint.type": "collection",
                  "gradient_checkpoint.check_gradients": body == "cond",
                  "cluster.num_cpu_devices": 2}, replicas=2)
  recomputed = [op for op in graph.get_operations()
                if op.name.startswith("EPL_GRADIENT_CHECKPOINTS/")]
  assert recomputed
  assert not any(control_flow.context_of(op) for op in recomputed)


def test_error_check_gradients_with_a_loop_in_backward():
  with pytest.raises(ValueError, match=r"check_gradients.*while-loop.*"
                     r"gradient_checkpoint.check_gradients to False"):
    training.train(_model(_checkpointed(_while_body)), steps=1,
                   config={"gradient_checkpoint.type": "collection",
                           "gradient_checkpoint.check_gradients": True})


def _loss_scale_optimizer():
  return tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.MomentumOptimizer(0.05, 0.9), "dynamic")


@pytest.mark.parametrize("extra,micro_batches,replicas", [
    ({"cluster.num_cpu_devices": 2}, 1, 2),
    ({"pipeline.num_micro_batch": 2}, 2, 1),
], ids=["data_parallel", "accumulation"])
def test_dynamic_loss_scale_optimizer(monkeypatch, extra, micro_batches,
                                      replicas):
  monkeypatch.setitem(training.OPTIMIZERS, "loss_scale",
                      _loss_scale_optimizer)
  graph = _check(functools.partial(_dense, units=16, seed=1, name="body",
                                   activation=tf.nn.tanh),
                 extra, micro_batches=micro_batches, replicas=replicas,
                 optimizer="loss_scale")
  assert _v1_ops(graph)


def test_error_loop_split_across_stages():
  def split_loop(x):
    weight = tf.compat.v1.get_variable(
        "loop_weight", [training.FEATURES, training.FEATURES])

    def body(step, hidden):
      hidden = tf.tanh(tf.matmul(hidden, weight))
      epl.set_default_strategy(epl.replicate(device_count=1, name="stage_1"))
      return step + 1, hidden * 2.0
    epl.set_default_strategy(epl.replicate(device_count=1, name="stage_0"))
    _, hidden = tf.while_loop(lambda step, _: step < 3, body,
                              [tf.constant(0), x])
    return _dense(hidden, 1, 2, "head")
  with pytest.raises(ValueError, match=r"while-loop 'while/while_context' "
                     r"spans two pipeline stages.*inside one stage scope"):
    training.train(split_loop, steps=1, default_strategy=False,
                   config={"cluster.num_cpu_devices": 2,
                           "pipeline.num_micro_batch": 2})


def test_error_gradients_inside_a_loop_body():
  def inner_gradient(x):
    weight = tf.compat.v1.get_variable(
        "loop_weight", [training.FEATURES, training.FEATURES])

    def body(step, hidden):
      grad, = tf.gradients(tf.reduce_sum(tf.matmul(hidden, weight)), weight)
      return step + 1, hidden - tf.reduce_sum(grad)
    _, hidden = tf.while_loop(lambda step, _: step < 2, body,
                              [tf.constant(0), x])
    return _dense(hidden, 1, 2, "head")
  with pytest.raises(ValueError, match=r"gradient of 'loop_weight.*inside "
                     r"the TF1 while-loop.*outside the loop body"):
    training.train(inner_gradient, steps=1,
                   config={"cluster.num_cpu_devices": 2})
