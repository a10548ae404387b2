"""Keras checkpoints of TF2 scripts trained under EPL with eager execution
on, one scenario per run: `python tests/clients/keras_checkpoints.py NAME`.
tests/test_keras_checkpoints.py runs them and reads what they print. The
scripts are those of tests/clients/tf2_scripts.py (4 CPU replicas).

- loop_save_weights_<h5|tf>: after an eager loop over a `@tf.function`
  step, `model.save_weights` (HDF5 or TensorFlow format); after
  `epl.shutdown()`, `load_weights` into a model built without EPL gives
  the trained weights, and so does `load_weights` into a model built
  under EPL (before training it further).
- fit_model_checkpoint: `Model.fit` with a `ModelCheckpoint` callback
  (weights only, each epoch); the last file, loaded into a model built
  without EPL, holds the weights fit ended with, which equal plain `fit`.
"""
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

import epl
from tests import tolerance
from tests.clients import tf2_scripts


def _assert_same(actual, expected):
  for a, e in zip(actual, expected):
    np.testing.assert_array_equal(a, e)


def _loop_save_weights(suffix):
  path = os.path.join(tempfile.mkdtemp(), "weights" + suffix)
  tf2_scripts._init()  # pylint: disable=protected-access
  model, _ = tf2_scripts._train("adam")  # pylint: disable=protected-access
  model.save_weights(path)
  under_epl = tf2_scripts._model()  # pylint: disable=protected-access
  under_epl.load_weights(path)
  _assert_same(under_epl.get_weights(), model.get_weights())
  epl.shutdown()
  restored = tf2_scripts._model()  # pylint: disable=protected-access
  restored.load_weights(path)
  _assert_same(restored.get_weights(), model.get_weights())
  print("KERAS_CHECKPOINT_OK save_weights%s" % suffix)


def loop_save_weights_h5():
  _loop_save_weights(".h5")


def loop_save_weights_tf():
  _loop_save_weights(".ckpt")


def fit_model_checkpoint():
  path = os.path.join(tempfile.mkdtemp(), "epoch_{epoch}.h5")
  tf2_scripts._init()  # pylint: disable=protected-access
  model = tf2_scripts._model()  # pylint: disable=protected-access
  callback = tf.keras.callbacks.ModelCheckpoint(path, save_weights_only=True)
  model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="mse")
  data = tf.data.Dataset.from_tensor_slices(
      tf2_scripts._data()).batch(tf2_scripts.GLOBAL_BATCH)  # pylint: disable=protected-access
  model.fit(data, epochs=2, verbose=0, shuffle=False, callbacks=[callback])
  epl.shutdown()
  restored = tf2_scripts._model()  # pylint: disable=protected-access
  restored.load_weights(path.format(epoch=2))
  _assert_same(restored.get_weights(), model.get_weights())
  expected, _ = tf2_scripts._fit(tf2_scripts._model())  # pylint: disable=protected-access
  for actual, wanted in zip(restored.get_weights(), expected):
    tolerance.assert_equivalent(actual, wanted)
  print("KERAS_CHECKPOINT_OK ModelCheckpoint")


if __name__ == "__main__":
  globals()[sys.argv[1]]()
