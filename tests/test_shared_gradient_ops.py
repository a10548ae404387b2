"""Gradients that reach their updates through an op shared by all of them
(`tf.identity_n` over the gradient list, as Keras's optimizers do; clipping
by the global norm) train as without it under every pass that maps
gradients to updates, or fail at the rewrite when they cannot."""
import pytest
import tensorflow as tf

import epl
from epl.parallel.passes import zero
from epl.parallel.plan.decisions import ZeroLevel
from tests import training
from tests.tolerance import AMP_TOLERANCE

MICRO = 8
REPLICAS = 4


def _identity_n(grads):
  return tf.identity_n(grads)


def _identity_n_then_identity(grads):
  return [tf.identity(g) for g in tf.identity_n(grads)]


def _global_norm_clip(grads):
  return tf.clip_by_global_norm(grads, 0.1)[0]


def _unchanged(grads):
  return grads


def _train(config, optimizer, process, batch_size=MICRO):
  """layers_model trained on `batch_size` rows per replica, its gradients
  passed through `process`; EPL with `config`, or plain TensorFlow."""
  epl.shutdown()
  if config is not None:
    epl.init(epl.Config(dict({"cluster.num_cpu_devices": REPLICAS},
                             **config)))
    epl.set_default_strategy(epl.replicate(device_count=1))
  values = training.processed_training(training.OPTIMIZERS[optimizer],
                                       batch_size, process)
  epl.shutdown()
  return values


def _check(config, optimizer, process, micro_batches=1):
  expected = _train(None, optimizer, process,
                    REPLICAS * micro_batches * MICRO)
  training.assert_close(_train(config, optimizer, process), expected)


@pytest.mark.parametrize("process", [_identity_n, _identity_n_then_identity])
@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
@pytest.mark.parametrize("level", ["v0", "v1", "v2"])
def test_zero_through_identity_n_matches_single_device(level, optimizer,
                                                       process):
  _check({"zero.level": level}, optimizer, process)


@pytest.mark.parametrize("level", ["v1", "v2"])
def test_zero_through_identity_n_with_micro_batches(level):
  _check({"zero.level": level, "pipeline.num_micro_batch": 2}, "adam",
         _identity_n, micro_batches=2)


@pytest.mark.parametrize("level", ["v0", "v1", "v2"])
def test_zero_clips_by_global_norm_as_data_parallel_does(level):
  """Without communication.clip_after_allreduce each replica clips its own
  gradients before the reduce (docs/data_parallel.md); ZeRO keeps that."""
  training.assert_close(_train({"zero.level": level}, "adam",
                               _global_norm_clip),
                        _train({}, "adam", _global_norm_clip))


@pytest.mark.parametrize("config", [
    {},  # gradient aggregation alone
    {"optimizer.num_apply_group": 2},
    {"offload.level": "v0"},
    {"zero.level": "v1", "offload.level": "v0",
     "optimizer.num_apply_group": 2},
], ids=["aggregation", "grouped_apply", "offload", "zero_offload_grouped"])
def test_other_passes_through_identity_n_match_single_device(config):
  _check(config, "adam", _identity_n)


@pytest.mark.parametrize("level", ["", "v1"])
def test_loss_scale_through_identity_n(level):
  """AMP's dynamic loss scale decides on the gradients the updates read:
  the same steps with and without the IdentityN."""
  config = {"amp.level": "O1", "zero.level": level} if level else {
      "amp.level": "O1"}
  training.assert_close(_train(config, "adam", _identity_n),
                        _train(config, "adam", _unchanged),
                        atol=AMP_TOLERANCE["float16"])


@pytest.mark.parametrize("level, sharded, shared, fix", [
    (ZeroLevel.V1, False, "add", "tf.identity_n work"),
    (ZeroLevel.V3, True, "identity_n", "zero.min_partition_size"),
])
def test_zero_refuses_an_update_reading_a_gradient_shared_with_others(
    level, sharded, shared, fix):
  """An update that reads its gradient through an op other gradients feed
  (v1, v2, v3's whole variables: besides Identity, IdentityN; v3's
  partitioned weights: any) cannot get the reduced gradient."""
  with tf.Graph().as_default():
    weights = [tf.Variable([1.0], name="w%d" % i) for i in range(2)]
    grads = [tf.constant([0.5], name="grad%d" % i) for i in range(2)]
    mixed = (tf.add(grads[0], grads[1], name="mixed") if shared == "add"
             else tf.identity_n(grads, name="mixed")[0])
    update = weights[0].assign_sub(mixed)
    with pytest.raises(ValueError) as raised:
      zero._check_updates_read_gradients(  # pylint: disable=protected-access
          level, [(grads[0], weights[0].op)],
          {weights[0].op.name: [update.op]}, sharded=sharded)
  for words in ("zero.level %r" % level.value, "'w0'", "'grad0:0'",
                "'mixed'", fix, "zero.level 'v0'"):
    assert words in str(raised.value)
