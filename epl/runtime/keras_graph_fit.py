"""Keras `Model.fit` in graph mode (a TF1 script with tf-keras): its train
function becomes a `Session.run` of the graph EPL rewrites.

In graph mode Keras 2 builds the training step in the session's graph
(`training_v1.Model._make_train_function`: the loss, the legacy
optimizer's `get_updates`, which calls `tf.gradients` and
`apply_gradients`) and runs it through a Keras backend function, a
callable of the session made from the fetch and feed names
(`Session._make_callable_from_options`). Such a callable bypasses
`Session.run`, where EPL rewrites the graph, swaps fetches for their
merged values and checks the fed batch. Under EPL a backend function runs
`Session.run` instead, with the same feeds and fetches.

Keras' loss and metrics, built in `compile` outside the user's scopes,
go to the stage that computes the model's outputs. The loss comes back
from each step as its mean over replicas and micro-batches (the whole
batch's). The compiled metrics stay outside the step EPL divides: they
update their state once per step from the model's outputs merged over
replicas and micro-batches and the whole fed targets, so `fit` and
`evaluate` report what they report without EPL. Keras' session is opened
again after the rewrite (`epl.runtime.keras_session`).
"""
import contextlib
import logging
import weakref

import numpy as np
import tensorflow as tf

from epl import collections
from epl.env import active
from epl.ir import graph_editor
from epl.ir.graph_state import state_of
from epl.parallel.passes import merge_outputs
from epl.parallel.plan.decisions import MicroBatching
from epl.tf_compat import keras

logger = logging.getLogger("epl")


class MetricsNotSupported(NotImplementedError):
  """A Keras metric compiled into Model.fit in graph mode under EPL that
  reads a tensor of the model other than its outputs."""


class PipelinedPredictNotSupported(NotImplementedError):
  """Model.predict of a pipelined model in graph mode under EPL."""


def make_callable(function, feeds, session):
  """What Keras' `GraphExecutionFunction._make_callable` makes under EPL:
  a callable that runs the function's step through `Session.run`. `feeds`
  is (feed_arrays, feed_symbols, symbol_vals): placeholders fed arrays,
  and placeholders fed from tensors (a dataset's batch)."""
  _refuse_pipelined_predict(function, session.graph)
  fetches, target, extra = keras.graph_function_step(function)
  feed_arrays, feed_symbols, symbol_vals = feeds
  fed = list(feed_arrays) + extra

  def run(*arrays, run_metadata=None):
    feed_dict = dict(zip(fed, arrays))
    if feed_symbols:
      # A batch drawn from tensors in the graph (a dataset's iterator) is
      # drawn first, then fed whole: EPL divides fed batches.
      values = session.run(list(symbol_vals))
      feed_dict.update(
          (placeholder, np.asarray(value, placeholder.dtype.as_numpy_dtype))
          for placeholder, value in zip(feed_symbols, values))
    return session.run([fetches, target], feed_dict,
                       run_metadata=run_metadata)[0]

  keras.set_graph_function_callable(function, run, feeds, session)


def _refuse_pipelined_predict(function, graph):
  """`Model.predict` of a model in pipeline stages reads the stages'
  outputs, which the schedule runs with the training step's loss."""
  state = state_of(graph)
  if (function.name == "predict_function" and state is not None and
      state.rewrite_result is not None and len(state.taskgraphs) > 1):
    raise PipelinedPredictNotSupported(
        "Keras Model.predict of a model built in %d pipeline stages, in "
        "graph mode under EPL, is not supported yet (the pipeline runs "
        "the stages with the training step). Save the weights "
        "(model.save_weights) and predict with the model built without "
        "EPL; Model.evaluate works." % len(state.taskgraphs))


# Model -> the outputs its predict function fetches instead of the
# model's own, once the step's micro-batches run as a loop.
_whole_batch_outputs = weakref.WeakKeyDictionary()


def predict_whole_batch(model):
  """After Keras made `model`'s predict function: when the rewritten step
  runs its micro-batches as a loop, the model's outputs merged over
  replicas and micro-batches come out of that loop, which runs the
  training step's forward and backward passes and reads the targets,
  which `predict` does not feed. The predict function then fetches the
  outputs of the model called once more on the fed batch, whole, with
  replica 0's weights (the user's), as without EPL (built once, logged)."""
  state = state_of(model.outputs[0].graph) if model.outputs else None
  result = state.rewrite_result if state is not None else None
  if (result is None or result.plan.num_micro_batch == 1 or
      result.micro_batching.value is not MicroBatching.LOOP):
    return
  outputs = _whole_batch_outputs.get(model)
  if outputs is not None and list(
      model.predict_function.outputs) == outputs:
    return
  if outputs is None:
    inputs = model.inputs if len(model.inputs) > 1 else model.inputs[0]
    outputs = _whole_batch_outputs[model] = tf.nest.flatten(model(inputs))
    logger.info(
        "EPL: Keras Model.predict of %s computes its outputs on the whole "
        "batch with replica 0's weights: the step's %d micro-batches run "
        "as a loop, which predict cannot run without the targets",
        model.name, result.plan.num_micro_batch)
  keras.set_predict_outputs(model, outputs)


def output_stage(model, what):
  """The stage scope to build `what` of Keras in: the strategy of
  the TaskGraph that computes `model`'s first output, when the model was
  built in stage scopes and no scope is open and no default strategy set
  (a TF1 script builds its loss in its last stage likewise); else None."""
  env = active()
  if env is None or env.current_strategy() is not None or not model.outputs:
    return None
  output = model.outputs[0]
  state = state_of(output.graph)
  taskgraph = state.taskgraph_of(output.op) if state is not None else None
  if taskgraph is None:
    return None
  logger.info("EPL: Keras builds %s of %s in stage %r, which computes the "
              "model's outputs", what, model.name, taskgraph.name)
  return taskgraph.strategy


def make_train_function(original, model, *args, **kwargs):
  """Keras' `_make_train_function` under EPL, in graph mode: built in the
  stage of the model's outputs (the optimizer's step count, which Keras
  creates there, belongs to that stage); the loss it returns is
  the mean over replicas and micro-batches, the whole batch's, and the
  model's outputs are every replica's and micro-batch's, in the batch's
  order."""
  built = getattr(model, "train_function", None)
  stage = output_stage(model, "the optimizer's step count")
  with stage or contextlib.nullcontext():
    result = original(model, *args, **kwargs)
  function = model.train_function
  if function is None or function is built:
    return result
  try:
    _read_merged_outputs(model, function.outputs[0], function.outputs[1:])
  except MetricsNotSupported:
    model.train_function = None
    raise
  collections.add_to_collection(function.outputs[0],
                                collections.GraphKeys.GLOBAL_MEAN_OBJECTS)
  # `predict` and `evaluate` fetch these too: every row of the batch.
  for output in model.outputs:
    collections.add_to_collection(
        output, collections.GraphKeys.GLOBAL_CONCAT_OBJECTS)
  return result


def _read_merged_outputs(model, loss, metrics):
  """Makes the compiled metrics of `model` (the result tensors `metrics`)
  update with the model's outputs of the whole batch: merged over
  replicas and micro-batches, in the batch's order, as `predict` returns
  them. Keras builds the metrics outside the training step, from the
  outputs and the fed targets (whole: EPL divides the batch for the step
  only); they run once per step, on their own state variables, as without
  EPL. A metric that reads any other tensor of the forward pass (an
  output's mask, a layer's activations) would see one replica's and
  micro-batch's part: that raises. The metrics of a model with several
  outputs that average each output's loss read it as its mean over
  replicas and micro-batches, as `fit` reports the total loss."""
  outputs = {tensor.name for tensor in model.outputs}
  inputs = [tensor.op for tensor in model.inputs]
  forward = ({op.name for op in graph_editor.ancestors([loss.op])} &
             {op.name for op in graph_editor.descendants(inputs)})
  output_losses = keras.output_loss_results(model)
  readers, losses = [], []
  for name, metric in zip(model.metrics_names[1:], metrics):

    def inputs_of(op, name=name, of_loss=metric.name in output_losses):
      found = []
      for tensor in op.inputs:
        if tensor.name in outputs:
          readers.append(op)
        elif of_loss and tensor.op.name in forward:
          # An output's loss, a mean over the batch like the total loss:
          # the whole batch's is the mean over the equal parts.
          readers.append(op)
          losses.append(tensor)
        elif tensor.op.name in forward:
          raise MetricsNotSupported(
              "Keras Model.fit of %s in graph mode under EPL: the metric %r "
              "reads %r, a tensor of the model's forward pass that EPL "
              "divides over replicas and micro-batches (a metric gets the "
              "model's outputs of the whole batch only). Remove the "
              "metric, or compute it after training, from the weights, "
              "in a model built without EPL (docs/tf2.md)." % (
                  model.name, name, tensor.name))
        else:
          found.append(tensor.op)
      return found + list(op.control_inputs)

    graph_editor.reachable([metric.op], inputs_of)
  collections.add_to_collection(losses,
                                collections.GraphKeys.GLOBAL_MEAN_OBJECTS)
  merge_outputs.read_merged_values(readers)
  if readers:
    logger.info("EPL: the compiled metrics of %s (%s) update with its "
                "outputs merged over replicas and micro-batches", model.name,
                ", ".join(model.metrics_names[1:]))
