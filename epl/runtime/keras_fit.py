"""Keras `Model.fit` with eager execution on: its train function becomes a
step EPL can divide over replicas.

Keras' own train function is a `tf.function` that takes the dataset's
iterator and draws the batch inside, so the batch never crosses the
function's boundary where EPL divides it (`epl.runtime.traced_function`).
Under EPL the train function draws the batch eagerly and calls a
`tf.function` of `Model.train_step` with the batch's tensors: the same
step (the loss, the optimizer's `minimize`, the compiled metrics, the step
count), traced and rewritten like a script's own step.
"""
import tensorflow as tf

from epl.runtime.traced_function import NotSupportedInTracedStep
from epl.tf_compat import keras


def make_train_function(original, model, force=False):
  """Model.make_train_function under EPL, eager execution on."""
  if model.train_function is not None and not force:
    return model.train_function
  what = "Model.fit of %s" % model.name
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
  del original

  @tf.function
  def train_step(*data):
    outputs = model.train_step(data if len(data) > 1 else data[0])
    with tf.control_dependencies(tf.nest.flatten(outputs)):
      keras.count_train_step(model)
    return outputs

  def train_function(iterator):
    # get_next, not next(): the end of the data is the OutOfRangeError
    # Keras' epoch loop waits for, as from its own train function.
    data = iterator.get_next()
    if isinstance(data, tuple):
      return train_step(*data)
    return train_step(data)

  model.train_function = train_function
  return train_function

