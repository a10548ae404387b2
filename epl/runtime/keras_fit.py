"""Keras `Model.fit` with eager execution on: its train function becomes a
step EPL can divide over replicas.

Keras' own train function is a `tf.function` that takes the dataset's
iterator and draws the batch inside, so the batch never crosses the
function's boundary where EPL divides it (`epl.runtime.traced_function`).
Under EPL the train function draws the batch eagerly and calls a
`tf.function` with the batch's tensors, which EPL's engine rewrites like a
script's own step, data parallel or in pipeline stages.

The engine divides the batch among the replicas and their micro-batches
only; Keras' own train step would update its metrics with the whole
batch, outside them. So the step EPL traces computes the model's outputs,
the loss and the update only (`Model.compute_loss`, the optimizer's
`minimize`), and returns the outputs and the loss, merged over replicas
and micro-batches (the outputs concatenated in batch order, the loss
averaged: the whole batch's); the loss metric and the compiled metrics
are then updated with them eagerly, as Keras' step would update them. A
model with a `train_step` of its own has it traced as it is.
"""
import logging

import tensorflow as tf

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
  if keras.overrides_train_step(model):
    # Traced as it is: EPL's engine refuses one that reads the whole batch
    # outside the replicas' micro-batches.
    step = _own_train_step(model)
  else:
    logger.info("epl: %s updates its loss and metrics with the outputs "
                "merged over the replicas and micro-batches", what)
    step = _merged_train_step(model)

  def train_function(iterator):
    # get_next, not next(): the end of the data is the OutOfRangeError
    # Keras' epoch loop waits for, as from its own train function.
    data = iterator.get_next()
    return step(*(data if isinstance(data, tuple) else (data,)))

  model.train_function = train_function
  return train_function


def _own_train_step(model):
  """The model's own `train_step`, traced with the step count."""

  @tf.function
  def train_step(*data):
    outputs = model.train_step(data if len(data) > 1 else data[0])
    with tf.control_dependencies(tf.nest.flatten(outputs)):
      keras.count_train_step(model)
    return outputs
  return train_step


def _merged_train_step(model):
  """Keras' train step as a traced forward pass, loss and update, which
  return the outputs and the loss merged over the replicas and
  micro-batches; the loss metric and compiled metrics are updated with
  them eagerly."""

  @tf.function
  def forward_and_update(*data):
    x, y, sample_weight = _unpacked(data)
    with tf.GradientTape() as tape:
      y_pred = model(x, training=True)
      with keras.loss_metric_updates_left_out(model):
        loss = model.compute_loss(x, y, y_pred, sample_weight)
    model.optimizer.minimize(loss, model.trainable_variables, tape=tape)
    return y_pred, loss

  def train_step(*data):
    y_pred, loss = forward_and_update(*data)
    x, y, sample_weight = _unpacked(data)
    # Keras weighs each step's loss by its batch's rows.
    keras.loss_metric(model).update_state(
        loss, sample_weight=tf.shape(tf.nest.flatten(y_pred)[0])[0])
    outputs = model.compute_metrics(x, y, y_pred, sample_weight)
    keras.count_train_step(model)
    return outputs
  return train_step


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
