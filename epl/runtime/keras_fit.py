"""Keras `Model.fit` with eager execution on: its train function becomes a
step EPL can divide over replicas.

Keras' own train function is a `tf.function` that takes the dataset's
iterator and draws the batch inside, so the batch never crosses the
function's boundary where EPL divides it (`epl.runtime.traced_function`).
Under EPL the train function draws the batch eagerly and calls a
`tf.function` with the batch's tensors, which EPL's engine rewrites like a
script's own step, data parallel or in pipeline stages.

The model's `train_step` (Keras' own, or the model's) is traced as it is.
The engine divides the batch among the replicas and their micro-batches
for the forward pass, loss and gradients; the loss metric and compiled
metrics update outside them, once per step, with the model's outputs
concatenated over the parts in batch order, the losses averaged over
them (means over equal parts: the whole batch's) and the targets whole
(`epl.runtime.traced_whole_batch`), so fit reports what it reports
without EPL, for a model of several outputs too.
"""
import tensorflow as tf

from epl.runtime.traced_function import NotSupportedInTracedStep
from epl.tf_compat import keras


def make_train_function(original, model, force=False):
  """Model.make_train_function under EPL, eager execution on."""
  if model.train_function is not None and not force:
    return model.train_function
  what = "Model.fit of %s" % model.name
  _refuse_unsupported_fit(model, what)
  del original
  step = _train_step(model)

  def train_function(iterator):
    # get_next, not next(): the end of the data is the OutOfRangeError
    # Keras' epoch loop waits for, as from its own train function.
    data = iterator.get_next()
    return step(*(data if isinstance(data, tuple) else (data,)))

  model.train_function = train_function
  return train_function


def _train_step(model):
  """The model's `train_step`, traced with the step count."""

  @tf.function
  def train_step(*data):
    outputs = model.train_step(data if len(data) > 1 else data[0])
    with tf.control_dependencies(tf.nest.flatten(outputs)):
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
