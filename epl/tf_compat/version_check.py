"""Checks, once, that this TensorFlow is in the range of every function of
epl.tf_compat (`epl.tf_compat.VERSIONS`). Each module of the package that
imports TensorFlow's internals imports this one first, so that an
unsupported TensorFlow gets EPL's error naming the function and the range,
not the ImportError or AttributeError of a renamed internal."""
import tensorflow as tf

from epl import tf_compat

tf_compat.check(tf.__version__)
