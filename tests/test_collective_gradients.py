"""Gradients of the V2 collectives (epl.parallel.ops.collective_gradients) against
the same computation written without collectives."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops import collective_ops

from epl.parallel.ops import collective_gradients

from tests import tolerance

MEMBERS = 4
GROUP_KEY = 7


def _session(graph):
  return tf.compat.v1.Session(graph=graph, config=tf.compat.v1.ConfigProto(
      device_count={"CPU": MEMBERS}))


def _inputs(rows=3, cols=2):
  rng = np.random.RandomState(0)
  return [rng.normal(size=(rows, cols)).astype(np.float32)
          for _ in range(MEMBERS)]


def _member_gradients(collective, weights):
  """d(sum over members of sum(weights[r] * out_r)) / d x_r, each member
  differentiated on its own graph branch."""
  values = _inputs()
  graph = tf.Graph()
  with graph.as_default():
    grads = []
    for member, value in enumerate(values):
      with tf.device("/device:CPU:%d" % member):
        x = tf.constant(value)
        out = collective(x)
        loss = tf.reduce_sum(out * weights[member])
        grads.append(tf.gradients(loss, x)[0])
    with _session(graph) as session:
      return values, session.run(grads)


def test_all_reduce_sum_gradient_is_all_reduce_sum():
  weights = [float(r + 1) for r in range(MEMBERS)]
  values, grads = _member_gradients(
      lambda x: collective_ops.all_reduce_v2(x, MEMBERS, GROUP_KEY, 1),
      weights)
  for member in range(MEMBERS):
    tolerance.assert_equivalent(grads[member],
                               np.full_like(values[member], sum(weights)))


def test_all_reduce_mean_gradient_is_all_reduce_mean():
  weights = [float(r + 1) for r in range(MEMBERS)]
  _, grads = _member_gradients(
      lambda x: collective_ops.all_reduce_v2(x, MEMBERS, GROUP_KEY, 1,
                                             final_op="Div"), weights)
  for member in range(MEMBERS):
    tolerance.assert_equivalent(grads[member],
                               np.full((3, 2), sum(weights) / MEMBERS))


def test_all_gather_gradient_is_reduce_scatter():
  rng = np.random.RandomState(1)
  weights = [rng.normal(size=(3 * MEMBERS, 2)).astype(np.float32)
             for _ in range(MEMBERS)]
  _, grads = _member_gradients(
      lambda x: collective_ops.all_gather_v2(x, MEMBERS, GROUP_KEY, 1),
      weights)
  total = sum(weights)
  for member in range(MEMBERS):
    tolerance.assert_equivalent(grads[member],
                               total[3 * member:3 * member + 3])


def test_all_to_all_exchanges_blocks_and_its_gradient_is_all_to_all():
  rng = np.random.RandomState(2)
  weights = [rng.normal(size=(MEMBERS, 2)).astype(np.float32)
             for _ in range(MEMBERS)]
  # Two rows per member: all_to_all also takes dim 0 a multiple of it.
  weights = [np.repeat(w, 2, axis=0) for w in weights]
  values = [rng.normal(size=(2 * MEMBERS, 2)).astype(np.float32)
            for _ in range(MEMBERS)]
  graph = tf.Graph()
  with graph.as_default():
    grads, outs = [], []
    for member in range(MEMBERS):
      with tf.device("/device:CPU:%d" % member):
        x = tf.constant(values[member])
        out = collective_gradients.all_to_all(x, MEMBERS, GROUP_KEY, 1)
        outs.append(out)
        grads.append(tf.gradients(tf.reduce_sum(out * weights[member]), x)[0])
    with _session(graph) as session:
      outs, grads = session.run([outs, grads])
  for member in range(MEMBERS):
    # Block j of member r's output is block r of member j's input ...
    tolerance.assert_equivalent(outs[member], np.concatenate(
        [values[j][2 * member:2 * member + 2] for j in range(MEMBERS)]))
    # ... so block j of member r's input reaches member j's block r.
    tolerance.assert_equivalent(grads[member], np.concatenate(
        [weights[j][2 * member:2 * member + 2] for j in range(MEMBERS)]))


def test_max_all_reduce_is_not_differentiated():
  graph = tf.Graph()
  with graph.as_default():
    x = tf.constant([1.0])
    out = collective_ops.all_reduce_v2(x, 1, GROUP_KEY, 1, merge_op="Max")
    with pytest.raises(ValueError, match="merge_op 'Max'.*stop_gradient"):
      tf.gradients(out, x)
    assert tf.gradients(tf.stop_gradient(out) * x, x)[0] is not None
