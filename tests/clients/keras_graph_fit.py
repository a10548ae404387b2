"""Keras `Model.fit` in graph mode (a TF1 script: eager execution switched
off, tf-keras, legacy optimizers) under EPL, one scenario per run:
`python tests/clients/keras_graph_fit.py NAME [KEY=VALUE ...]`.
tests/test_keras_graph_fit.py runs them and reads what they print. Each
scenario trains under EPL, then, after `epl.shutdown()` and
`clear_session()`, the same script without EPL, and compares the weights
after 5 steps (2 epochs of 5 steps where it says so).

- dp: `disable_eager_execution()`, a Sequential model, legacy Adam, 4 CPU
  replicas (the default strategy): weights, each epoch's loss, `evaluate`
  and `predict` after training equal plain Keras (a pipeline's `predict`
  raises EPL's error, printed).
- dp_in_scope: the Sequential model built inside `with epl.replicate(1):`
  (no default strategy; the issue's third script, in graph mode).
- dp_v1_behavior: `disable_v2_behavior()` (reference variables, the
  metrics' too) and a `tf.compat.v1.train` optimizer, with
  `metrics=["mae"]`.
- pipeline: a functional model whose two Dense layers are called in two
  stage scopes, 4 micro-batches, 2 replicas of the pipeline.
- pipeline_sequential: a Sequential model whose layers are added in the
  stage scopes.
- checkpoints: data parallel, 2 epochs with a `ModelCheckpoint` callback
  (weights only, each epoch), then `load_weights` of the first epoch's
  file and one more epoch; equal to the same without EPL, and the last
  epoch's file holds the weights fit ended with.
- Extra KEY=VALUE arguments are EPL config entries (zero.level=v1).
- v2_optimizer: the Keras v2 Adam in graph mode; prints TensorFlow's
  error, which EPL leaves as it is, with and without EPL.
- dp_metrics, pipeline_metrics: as dp and pipeline, with `metrics=["mae"]`
  and 2 epochs: each epoch's loss and mae in History and `evaluate`'s
  equal plain Keras too.
- dp_weighted_metrics: dp with a weight per row, `metrics=["mse"]` and
  `weighted_metrics=["mae"]`.
- pipeline_two_outputs: pipeline_metrics with a model of two outputs:
  History's total loss, each output's loss and each output's mae.
- pipeline_v1_behavior_metrics: pipeline_metrics after
  `disable_v2_behavior()` (reference variables, v1 control flow).
- dp_accuracy, pipeline_accuracy: the same with a 3-class softmax
  classifier, sparse categorical cross-entropy and `metrics=["accuracy"]`.
- metrics_refused: a metric of a tensor inside the model (`add_metric` of
  a hidden layer's mean) raises EPL's error.
"""
import contextlib
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

import epl
from tests import tolerance

REPLICAS = 4
GLOBAL_BATCH = 32
ROWS = 5 * GLOBAL_BATCH


def _data():
  rng = np.random.RandomState(0)
  return (rng.normal(size=(ROWS, 8)).astype(np.float32),
          rng.normal(size=(ROWS, 1)).astype(np.float32))


def _labels():
  """The data of a 3-class classifier: the class of each row is where its
  first 3 features peak."""
  x, _ = _data()
  return x, np.argmax(x[:, :3], axis=1).astype(np.int64)


def _weighted_data():
  """_data with a weight per row."""
  x, y = _data()
  return x, y, np.linspace(0.1, 2.0, ROWS).astype(np.float32)


def _two_targets():
  """_data with a second target, for a model with two outputs."""
  x, y = _data()
  return x, [y, np.tanh(y)]


# (loss, compile's metrics arguments, data) of the model trained.
REGRESSION = ("mse", {}, _data)
REGRESSION_MAE = ("mse", {"metrics": ["mae"]}, _data)
CLASSIFIER = ("sparse_categorical_crossentropy", {"metrics": ["accuracy"]},
              _labels)
TWO_OUTPUTS = ("mse", {"metrics": ["mae"]}, _two_targets)
WEIGHTED = ("mse", {"metrics": ["mse"], "weighted_metrics": ["mae"]},
            _weighted_data)


def _set_weights(model):
  rng = np.random.RandomState(1)
  model.set_weights([0.3 * rng.normal(size=w.shape).astype(np.float32)
                     for w in model.get_weights()])
  return model


def _stage(name, under_epl):
  return (epl.replicate(1, name=name) if under_epl
          else contextlib.nullcontext())


def _sequential(under_epl):
  del under_epl
  return tf.keras.Sequential([
      tf.keras.layers.Dense(16, activation="tanh", input_shape=(8,)),
      tf.keras.layers.Dense(1)])


def _sequential_in_scope(under_epl):
  with _stage("replicated", under_epl):
    return _sequential(under_epl)


def _functional_stages(under_epl):
  inputs = tf.keras.Input((8,))
  with _stage("stage_0", under_epl):
    hidden = tf.keras.layers.Dense(16, activation="tanh")(inputs)
  with _stage("stage_1", under_epl):
    outputs = tf.keras.layers.Dense(1)(hidden)
  return tf.keras.Model(inputs, outputs)


def _classifier(under_epl):
  del under_epl
  return tf.keras.Sequential([
      tf.keras.layers.Dense(16, activation="tanh", input_shape=(8,)),
      tf.keras.layers.Dense(3, activation="softmax")])


def _classifier_stages(under_epl):
  inputs = tf.keras.Input((8,))
  with _stage("stage_0", under_epl):
    hidden = tf.keras.layers.Dense(16, activation="tanh")(inputs)
  with _stage("stage_1", under_epl):
    outputs = tf.keras.layers.Dense(3, activation="softmax")(hidden)
  return tf.keras.Model(inputs, outputs)


def _two_outputs_stages(under_epl):
  inputs = tf.keras.Input((8,))
  with _stage("stage_0", under_epl):
    hidden = tf.keras.layers.Dense(16, activation="tanh")(inputs)
  with _stage("stage_1", under_epl):
    outputs = [tf.keras.layers.Dense(1)(hidden),
               tf.keras.layers.Dense(1, activation="tanh")(hidden)]
  return tf.keras.Model(inputs, outputs)


def _sequential_stages(under_epl):
  model = tf.keras.Sequential()
  with _stage("stage_0", under_epl):
    model.add(tf.keras.layers.Dense(16, activation="tanh", input_shape=(8,)))
  with _stage("stage_1", under_epl):
    model.add(tf.keras.layers.Dense(1))
  return model


def _fit(build, optimizer, under_epl, epochs=1, task=REGRESSION):
  """Trains the model `build(under_epl)` makes; returns what to compare."""
  loss, metrics, data = task
  model = _set_weights(build(under_epl))
  model.compile(optimizer=optimizer(), loss=loss, **metrics)
  x, y, *weights = data()
  weights = weights[0] if weights else None
  history = model.fit(x, y, sample_weight=weights, batch_size=GLOBAL_BATCH,
                      epochs=epochs, verbose=0, shuffle=False)
  result = {"weights": model.get_weights(), "history": history.history,
            "evaluate": model.evaluate(x, y, sample_weight=weights,
                                       batch_size=GLOBAL_BATCH, verbose=0)}
  try:
    result["predict"] = model.predict(x, batch_size=GLOBAL_BATCH)
  except NotImplementedError as error:
    print("KERAS_GRAPH_FIT_PREDICT_ERROR %s" % error)
  tf.keras.backend.clear_session()
  return result


def _compare(actual, expected):
  assert actual["history"].keys() == expected["history"].keys(), (
      actual["history"].keys(), expected["history"].keys())
  for key in ("weights", "history", "evaluate", "predict"):
    if key not in actual:
      continue
    for a, e in zip(tf.nest.flatten(actual[key]),
                    tf.nest.flatten(expected[key])):
      tolerance.assert_equivalent(a, e, err_msg=key)


def _equivalence(build, optimizer, config, default_strategy, epochs=1,
                 task=REGRESSION):
  epl.init(epl.Config(config))
  if default_strategy:
    epl.set_default_strategy(epl.replicate(device_count=1))
  actual = _fit(build, optimizer, True, epochs, task)
  epl.shutdown()
  expected = _fit(build, optimizer, False, epochs, task)
  _compare(actual, expected)
  print("KERAS_GRAPH_FIT_OK tf=%s config=%s history=%s evaluate=%s" % (
      tf.__version__, config, actual["history"], actual["evaluate"]))


def _legacy_adam():
  return tf.keras.optimizers.legacy.Adam(0.01)


def _extra_config():
  """The KEY=VALUE arguments as EPL config entries (a number as an int)."""
  pairs = (argument.split("=", 1) for argument in sys.argv[2:])
  return {key: int(value) if value.isdigit() else value
          for key, value in pairs}


def dp():
  tf.compat.v1.disable_eager_execution()
  _equivalence(_sequential, _legacy_adam,
               {"cluster.num_cpu_devices": REPLICAS, **_extra_config()},
               default_strategy=True, epochs=2)


def dp_in_scope():
  tf.compat.v1.disable_eager_execution()
  _equivalence(_sequential_in_scope, _legacy_adam,
               {"cluster.num_cpu_devices": REPLICAS, **_extra_config()},
               default_strategy=False)


def dp_v1_behavior():
  tf.compat.v1.disable_v2_behavior()
  _equivalence(_sequential,
               lambda: tf.compat.v1.train.MomentumOptimizer(0.05, 0.9),
               {"cluster.num_cpu_devices": REPLICAS, **_extra_config()},
               default_strategy=True, task=REGRESSION_MAE)


def _pipeline(build, epochs=1, task=REGRESSION,
              graph_mode=tf.compat.v1.disable_eager_execution):
  graph_mode()
  _equivalence(build, _legacy_adam,
               {"cluster.num_cpu_devices": 4, "pipeline.num_micro_batch": 4,
                **_extra_config()}, default_strategy=False, epochs=epochs,
               task=task)


def pipeline():
  _pipeline(_functional_stages)


def pipeline_sequential():
  _pipeline(_sequential_stages)


def _fit_from_checkpoints(under_epl):
  """2 epochs saved by ModelCheckpoint, then one more from the first's
  file: the weights at the end, and those the last file holds."""
  path = os.path.join(tempfile.mkdtemp(), "epoch_{epoch}.h5")
  model = _set_weights(_sequential(under_epl))
  model.compile(optimizer=_legacy_adam(), loss="mse")
  x, y = _data()
  checkpoint = tf.keras.callbacks.ModelCheckpoint(path, save_weights_only=True)
  model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, verbose=0,
            shuffle=False, callbacks=[checkpoint])
  trained = model.get_weights()
  model.load_weights(path.format(epoch=1))
  model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0,
            shuffle=False)
  result = {"weights": model.get_weights(), "trained": trained,
            "last_file": path.format(epoch=2)}
  tf.keras.backend.clear_session()
  return result


def dp_metrics():
  tf.compat.v1.disable_eager_execution()
  _equivalence(_sequential, _legacy_adam,
               {"cluster.num_cpu_devices": REPLICAS, **_extra_config()},
               default_strategy=True, epochs=2, task=REGRESSION_MAE)


def dp_accuracy():
  tf.compat.v1.disable_eager_execution()
  _equivalence(_classifier, _legacy_adam,
               {"cluster.num_cpu_devices": REPLICAS, **_extra_config()},
               default_strategy=True, epochs=2, task=CLASSIFIER)


def dp_weighted_metrics():
  tf.compat.v1.disable_eager_execution()
  _equivalence(_sequential, _legacy_adam,
               {"cluster.num_cpu_devices": REPLICAS, **_extra_config()},
               default_strategy=True, epochs=2, task=WEIGHTED)


def pipeline_metrics():
  _pipeline(_functional_stages, epochs=2, task=REGRESSION_MAE)


def pipeline_accuracy():
  _pipeline(_classifier_stages, epochs=2, task=CLASSIFIER)


def pipeline_two_outputs():
  _pipeline(_two_outputs_stages, epochs=2, task=TWO_OUTPUTS)


def pipeline_v1_behavior_metrics():
  _pipeline(_functional_stages, epochs=2, task=REGRESSION_MAE,
            graph_mode=tf.compat.v1.disable_v2_behavior)


def checkpoints():
  tf.compat.v1.disable_eager_execution()
  epl.init(epl.Config({"cluster.num_cpu_devices": REPLICAS}))
  epl.set_default_strategy(epl.replicate(device_count=1))
  actual = _fit_from_checkpoints(True)
  epl.shutdown()
  expected = _fit_from_checkpoints(False)
  for key in ("weights", "trained"):
    for a, e in zip(actual[key], expected[key]):
      tolerance.assert_equivalent(a, e, err_msg=key)
  restored = _set_weights(_sequential(False))
  restored.load_weights(actual["last_file"])
  for a, e in zip(restored.get_weights(), actual["trained"]):
    np.testing.assert_array_equal(a, e)
  print("KERAS_GRAPH_FIT_OK checkpoints tf=%s" % tf.__version__)


def _error_of(model, optimizer, metrics=None):
  """The error `fit` of `model` raises, as `type: message`."""
  model.compile(optimizer=optimizer, loss="mse", metrics=metrics)
  try:
    model.fit(*_data(), batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
  except (AttributeError, NotImplementedError, ValueError) as error:
    return "%s: %s" % (type(error).__name__, error)
  finally:
    tf.keras.backend.clear_session()
  return "no error"


def v2_optimizer():
  tf.compat.v1.disable_eager_execution()
  epl.init(epl.Config({"cluster.num_cpu_devices": REPLICAS}))
  epl.set_default_strategy(epl.replicate(device_count=1))
  under_epl = _error_of(_sequential(True), tf.keras.optimizers.Adam(0.01))
  epl.shutdown()
  plain = _error_of(_sequential(False), tf.keras.optimizers.Adam(0.01))
  assert under_epl == plain, (under_epl, plain)
  print("KERAS_GRAPH_FIT_ERROR %s" % under_epl)


def metrics_refused():
  tf.compat.v1.disable_eager_execution()
  epl.init(epl.Config({"cluster.num_cpu_devices": REPLICAS}))
  epl.set_default_strategy(epl.replicate(device_count=1))
  inputs = tf.keras.Input((8,))
  hidden = tf.keras.layers.Dense(16, activation="tanh")(inputs)
  model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(hidden))
  model.add_metric(tf.reduce_mean(hidden), name="hidden_mean",
                   aggregation="mean")
  print("KERAS_GRAPH_FIT_ERROR %s" % _error_of(model, _legacy_adam()))


if __name__ == "__main__":
  globals()[sys.argv[1]]()
