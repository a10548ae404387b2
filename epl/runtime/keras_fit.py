"""Keras `Model.fit` with eager execution on: its train function becomes a
step EPL can divide over replicas.

Keras' own train function is a `tf.function` that takes the dataset's
iterator and draws the batch inside, so the batch never crosses the
function's boundary where EPL divides it (`epl.runtime.traced_function`).
Under EPL the train function draws the batch eagerly and calls a
`tf.function` of `Model.train_step` with the batch's tensors: the same
step (the loss, the optimizer's `minimize`, the compiled metrics, the step
count), traced and rewritten like a script's own step.

A model in pipeline stages (its layers built, or its `call` run, in
`epl.replicate` scopes) runs its step through EPL's engine, which divides
the batch among the stages' micro-batches only; Keras' own train step
would update its metrics with the whole batch, outside them. For such a
model the step EPL traces computes the model's outputs, the loss and the
update only, and returns the outputs and the loss, merged over replicas
and micro-batches (the outputs concatenated in batch order, the loss
averaged: the whole batch's); the loss metric and the compiled metrics
are then updated with them eagerly, as Keras' step would update them.
"""
import logging

import tensorflow as tf

from epl.runtime import traced_function
from epl.runtime.traced_function import NotSupportedInTracedStep
from epl.tf_compat import keras

logger = logging.getLogger("epl")


def make_train_function(original, model, force=False):
  """Model.make_train_function under EPL, eager execution on."""
  if model.train_function is not None and not force:
    return model.train_function
  what = "Model.fit of %s" % model.name
  _refuse_unsupported_fit(model, what)
  del original

  @tf.function
  def train_step(*data):
    outputs = model.train_step(data if len(data) > 1 else data[0])
    with tf.control_dependencies(tf.nest.flatten(outputs)):
      keras.count_train_step(model)
    return outputs

  @tf.function
  def pipeline_step(*data):
    x, y, sample_weight = _unpacked(data)
    with tf.GradientTape() as tape:
      y_pred = model(x, training=True)
      with keras.loss_metric_updates_left_out(model):
        loss = model.compute_loss(x, y, y_pred, sample_weight)
    model.optimizer.minimize(loss, model.trainable_variables, tape=tape)
    return y_pred, loss

  def pipelined_train_step(*data):
    y_pred, loss = pipeline_step(*data)
    x, y, sample_weight = _unpacked(data)
    # Keras weighs each step's loss by its batch's rows.
    keras.loss_metric(model).update_state(
        loss, sample_weight=tf.shape(tf.nest.flatten(y_pred)[0])[0])
    outputs = model.compute_metrics(x, y, y_pred, sample_weight)
    keras.count_train_step(model)
    return outputs

  # Which step, decided at the first batch: the trace says whether the
  # model opens stages.
  chosen = []

  def train_function(iterator):
    # get_next, not next(): the end of the data is the OutOfRangeError
    # Keras' epoch loop waits for, as from its own train function.
    data = iterator.get_next()
    data = data if isinstance(data, tuple) else (data,)
    if not chosen:
      chosen.append(_step_for(model, what, train_step, pipelined_train_step,
                              data))
    return chosen[0](*data)

  model.train_function = train_function
  return train_function


def _refuse_unsupported_fit(model, what):
  """Raises for the settings of `model`'s fit that EPL does not rewrite."""
  if model.run_eagerly:
    raise NotSupportedInTracedStep(
        "%s runs eagerly (run_eagerly=True): EPL parallelises the traced "
        "step only; compile the model without run_eagerly." % what)
  if keras.steps_per_execution(model) != 1:
    raise NotSupportedInTracedStep(
        "%s: steps_per_execution %d is not supported under EPL yet; leave "
        "it 1 (docs/tf2.md)." % (what, keras.steps_per_execution(model)))
  if tf.distribute.has_strategy():
    raise NotSupportedInTracedStep(
        "%s is built in a tf.distribute strategy scope: EPL is the "
        "strategy; build the model without it." % what)


def _unpacked(data):
  return tf.keras.utils.unpack_x_y_sample_weight(
      data if len(data) > 1 else data[0])


def _step_for(model, what, train_step, pipelined_train_step, data):
  """Keras' train step, or, for a model in pipeline stages (its trace
  opens strategy scopes) that keeps Keras' own train step, the step whose
  metrics read the outputs merged over the micro-batches. A train step of
  the model's own is traced as it is (EPL's engine refuses one that reads
  the whole batch outside the micro-batches)."""
  if (keras.overrides_train_step(model) or
      not traced_function.opens_strategy_scopes(train_step, data)):
    return train_step
  logger.info("epl: %s updates its loss and metrics with the outputs "
              "merged over the pipeline's micro-batches and replicas",
              what)
  return pipelined_train_step
