"""What user calls become inside `epl.split(k)`: sharded ops over collectives.

The model is captured once, as replica 0 of the job; each replica's copy of
a split part becomes one shard when the rewrite gives it its shard index
and collective keys (`epl.parallel.passes.split`). What is built here therefore
works for any shard: the shard index is a Const that the rewrite sets per
replica, and the collectives carry placeholder group keys that it
replaces; the graph's provenance records them (and the random ops of a
shard's initial value) with their roles, which is how the rewrite finds
them.

- `dense` (`tf.compat.v1.layers.dense`): the features of the k replicas of
  a shard group are all-gathered; the kernel is sharded on the output
  (class) axis, ceil(units / k) columns a shard, the last shards padded
  with columns that every lowering below ignores (so any class count
  works). Returns the shard's logits `[k * batch, columns]`, never
  gathered.
- `sparse_softmax_cross_entropy` (tf.compat.v1.losses and tf.nn): global
  max (all-reduce max), sum of exponentials (all-reduce sum) and the
  label's logit (one shard holds it: all-reduce sum of a masked pick); the
  loss is the group's, equal on every shard.
- `argmax`, `top_k`: per shard, then the shards' candidates are gathered.
- `equal`: predictions of `argmax` against labels gathered like features.
"""
import collections
import contextlib
import dataclasses
import logging

import numpy as np
import tensorflow as tf

from epl.env import Env
from epl.capture import capture
from epl.ir import graph_state
from epl.ir import names as epl_names
from epl.ir import provenance
from epl.ir import variables
from epl.parallel.ops import collective_gradients
from epl.strategies.strategy import Split
from epl.tf_compat.ops import collective_ops
from epl.tf_compat.ops import tensor_util

logger = logging.getLogger("epl")

# Group key of every capture-time collective; the rewrite replaces it.
PLACEHOLDER_GROUP_KEY = 1 << 20


@dataclasses.dataclass
class ShardedLogits:
  """What the lowerings downstream of a split dense need to know."""
  num_classes: int
  columns: int
  group_size: int
  start: object      # int32 scalar tensor: the shard's first class
  valid: object      # bool [columns]: the columns that are real classes
  strategy: Split    # the split scope that built the layer
  # Ops that read the logits and know they are sharded (built here).
  lowered_consumers: set = dataclasses.field(default_factory=set)


@contextlib.contextmanager
def _in_split_scope(info):
  """Ops built inside belong to the split scope that built the layer of
  `info`, also when the script calls tf.argmax or tf.equal on the split
  outputs after leaving that scope (an accuracy): they are part of the
  layer's sharded computation, and every replica needs their collectives."""
  if Env.get().active_strategy is not None:
    yield
    return
  with info.strategy:
    yield


@contextlib.contextmanager
def _lowering(logits, info):
  """Ops built inside that read `logits` are lowerings: they know it is
  sharded, and belong to the layer's split scope."""
  before = {op.name for op in logits.consumers()}
  with _in_split_scope(info):
    yield
  info.lowered_consumers.update(
      op.name for op in logits.consumers() if op.name not in before)


def _records(graph=None, create=False):
  """The SplitRecords of `graph` (the default graph). They live on the
  graph, so a dropped graph is freed with them; empty ones when nothing was
  recorded and not `create`."""
  state = graph_state.state_of(graph or tf.compat.v1.get_default_graph(),
                               create=create)
  return state.split if state is not None else graph_state.SplitRecords()


@dataclasses.dataclass
class ShardedVariable:
  """A variable whose replicas hold shards: `columns` entries of axis
  `axis` each, of `full_size` in the unsharded variable."""
  axis: int
  full_size: int
  columns: int
  group_size: int


def sharded_variables_in(graph):
  """{variable op name: ShardedVariable} of the split variables of `graph`."""
  return _records(graph).variables


def sharding_of(graph, variable):
  """The ShardedVariable of `variable` (an op of `graph`): its own record,
  or for an optimizer slot of the same shape its owner's; None when its
  replicas hold it whole."""
  recorded = sharded_variables_in(graph)
  if variable.name in recorded:
    return recorded[variable.name]
  owner = variables.slot_owner(variable)
  if owner is not None and owner.name in recorded and (
      variable.get_attr("shape") == owner.get_attr("shape")):
    return recorded[owner.name]
  return None


def full_shape(graph, variable):
  """The static shape of `variable` unsharded: a checkpoint holds a split
  variable (and its slots) whole."""
  shape = tf.TensorShape(variable.get_attr("shape"))
  info = sharding_of(graph, variable)
  if info is None or not shape.is_fully_defined():
    return shape
  dims = shape.as_list()
  dims[info.axis] = info.full_size
  return tf.TensorShape(dims)


def record_variable(variable, axis, full_size, columns, group_size):
  """Marks `variable` as sharded (see ShardedVariable)."""
  _records(create=True).variables[variable.op.name] = ShardedVariable(
      axis, full_size, columns, group_size)


def sharded_logits_in(graph):
  """{tensor name: ShardedLogits} of the split dense outputs of `graph`."""
  return _records(graph).logits


def sharded_logits_of(tensor):
  if not isinstance(tensor, tf.Tensor):
    return None
  return _records().logits.get(tensor.name)


def split_strategy():
  """The open split scope's strategy, or None."""
  strategy = Env.get().current_strategy() if Env.initialised() else None
  return strategy if isinstance(strategy, Split) else None


def group_size_of(strategy):
  """Devices a split strategy shards over (None: all)."""
  return strategy.device_count or Env.get().cluster.total_devices


def _settings():
  env = Env.get()
  return dict(
      communication_hint="nccl" if env.cluster.device_type == "GPU" else "ring",
      timeout=float(env.config.cluster.collective_timeout_seconds))


def shard_index():
  """This shard's index in its group (a Const the rewrite sets per replica)."""
  with capture.role_scope(provenance.SHARD_INDEX):
    return tf.constant(0, tf.int32, name=epl_names.SHARD_INDEX)


def _in_half_precision(exchange):
  """`exchange(tensor)` in float16 when communication.fp16 is set (float32
  tensors only): the bridges between replicas and shards send half the
  bytes; gradients flow back through the casts."""

  def run(tensor):
    if not (Env.get().config.communication.fp16 and
            tensor.dtype == tf.float32):
      return exchange(tensor)
    return tf.cast(exchange(tf.cast(tensor, tf.float16)), tf.float32)
  return run


def all_gather(tensor, group_size):
  """Concatenation (dim 0) of the tensor of every member of the group
  (every member's dim 0 must be the same)."""
  with capture.role_scope(provenance.SPLIT_COLLECTIVE):
    gathered = _in_half_precision(lambda t: collective_ops.all_gather_v2(
        t, group_size, PLACEHOLDER_GROUP_KEY,
        collective_gradients.next_instance_key(), **_settings()))(tensor)
  if not tensor.shape.rank:
    return gathered
  rows = tf.compat.dimension_value(tensor.shape[0])
  gathered.set_shape([rows * group_size if rows is not None else None] +
                     tensor.shape[1:].as_list())
  return gathered


def all_reduce(tensor, group_size, merge_op="Add"):
  with capture.role_scope(provenance.SPLIT_COLLECTIVE):
    return collective_ops.all_reduce_v2(
        tensor, group_size, PLACEHOLDER_GROUP_KEY,
        collective_gradients.next_instance_key(), merge_op=merge_op,
        **_settings())


def all_to_all(tensor, group_size):
  with capture.role_scope(provenance.SPLIT_COLLECTIVE):
    return _in_half_precision(lambda t: collective_gradients.all_to_all(
        t, group_size, PLACEHOLDER_GROUP_KEY,
        collective_gradients.next_instance_key(), **_settings()))(tensor)


def _fans(shape):
  receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
  if len(shape) < 2:
    return shape[0] if shape else 1, shape[0] if shape else 1
  return shape[-2] * receptive, shape[-1] * receptive


def _is_unseeded_variance_scaling(initializer):
  """TF1's and Keras' VarianceScaling (Glorot, He, LeCun) without a seed."""
  return all(hasattr(initializer, a) for a in (
      "scale", "mode", "distribution", "seed")) and initializer.seed is None


def _variance_scaling_shard(initializer, full_shape, shard_shape, dtype):
  """A shard drawn from the distribution of the unsharded variable: the
  fans come from the full shape (Glorot with the full fan-out)."""
  fan_in, fan_out = _fans(full_shape)
  fan = {"fan_in": fan_in, "fan_out": fan_out,
         "fan_avg": (fan_in + fan_out) / 2.0}[initializer.mode]
  variance = initializer.scale / max(1.0, fan)
  name = epl_names.SHARD_RANDOM
  # Recorded so that the rewrite gives each shard's copy its own seed.
  with capture.role_scope(provenance.SHARD_RANDOM):
    if initializer.distribution == "uniform":
      limit = np.sqrt(3.0 * variance)
      return tf.random.uniform(shard_shape, -limit, limit, dtype, name=name)
    if initializer.distribution in ("truncated_normal", "normal"):
      # The truncated normal's stddev correction, as TF's own initializer.
      return tf.random.truncated_normal(
          shard_shape, 0.0, np.sqrt(variance) / .87962566103423978, dtype,
          name=name)
    return tf.random.normal(shard_shape, 0.0, np.sqrt(variance), dtype,
                            name=name)


def sharded_initial_value(initializer, full_shape, axis, columns, start,
                          dtype, group_size):
  """The shard `[start, start + columns)` along `axis` of the initial value
  of a variable of `full_shape` cut into `group_size` shards of `columns`,
  zero past its end (the last shards may hold padding only: 5 classes
  over 4 shards of 2).

  Unseeded variance-scaling initializers (Glorot, He, ...) draw the shard
  alone, with the fans of the full shape; any other initializer builds the
  full value and slices it, so that a seeded or constant initializer gives
  exactly the values of the unsharded variable.
  """
  shard_shape = list(full_shape)
  shard_shape[axis] = columns
  if _is_unseeded_variance_scaling(initializer):
    return _variance_scaling_shard(initializer, full_shape, shard_shape,
                                   dtype)
  full = initializer(full_shape, dtype=dtype)
  padding = [[0, 0] for _ in full_shape]
  padding[axis][1] = columns * group_size - full_shape[axis]
  padded = tf.pad(full, padding)
  begin = [0] * len(full_shape)
  begin[axis] = start
  return tf.slice(padded, tf.stack(begin), shard_shape)


_DENSE_UNSUPPORTED = ("activity_regularizer", "kernel_regularizer",
                      "bias_regularizer", "kernel_constraint",
                      "bias_constraint")


def _check_dense_arguments(strategy, name, reuse, unsupported):
  """Raises for what a split dense layer cannot do: arguments it does not
  support (`unsupported`, those dense() got beyond its own), reuse."""
  unknown = set(unsupported) - set(_DENSE_UNSUPPORTED)
  if unknown:
    raise TypeError("dense() got unexpected arguments %s" % sorted(unknown))
  given = sorted(k for k, v in unsupported.items() if v is not None)
  if given:
    raise ValueError(
        "tf.compat.v1.layers.dense(name=%r) inside %r: %s not supported on a "
        "split dense layer; build it outside the split scope or drop them." %
        (name, strategy, ", ".join(given)))
  if reuse:
    raise ValueError(
        "tf.compat.v1.layers.dense(name=%r, reuse=%r) inside %r: a split "
        "dense layer cannot be reused; build it once." % (name, reuse,
                                                         strategy))


def dense(original, inputs, units, activation=None, use_bias=True,
          kernel_initializer=None, bias_initializer=None, trainable=True,
          name=None, reuse=None, **unsupported):
  """tf.compat.v1.layers.dense: sharded on `units` inside a split scope."""
  strategy = split_strategy()
  if strategy is None:
    given = dict(activation=activation, use_bias=use_bias,
                 kernel_initializer=kernel_initializer,
                 bias_initializer=bias_initializer, trainable=trainable,
                 name=name, reuse=reuse)
    # Only what the caller set: TF's defaults are not all None.
    given = {k: v for k, v in given.items() if v is not None}
    return original(inputs, units, **given, **unsupported)
  _check_dense_arguments(strategy, name, reuse, unsupported)
  group_size = group_size_of(strategy)
  inputs = tf.convert_to_tensor(inputs)
  in_dim = tf.compat.dimension_value(inputs.shape[-1])
  if inputs.shape.rank != 2 or in_dim is None:
    raise ValueError(
        "tf.compat.v1.layers.dense(name=%r) inside %r needs inputs of shape "
        "[batch, features] with known features, got %s." % (
            name, strategy, inputs.shape))
  columns = -(-units // group_size)
  dtype = inputs.dtype.base_dtype
  kernel_initializer = kernel_initializer or (
      tf.compat.v1.glorot_uniform_initializer())
  bias_initializer = bias_initializer or tf.compat.v1.zeros_initializer()
  with tf.compat.v1.variable_scope(name, default_name="dense") as scope:
    with tf.name_scope(scope.original_name_scope):
      index = shard_index()
      start = index * columns
      kernel = tf.compat.v1.get_variable(
          "kernel", initializer=sharded_initial_value(
              kernel_initializer, [int(in_dim), units], 1, columns, start,
              dtype, group_size), trainable=trainable)
      bias = tf.compat.v1.get_variable(
          "bias", initializer=sharded_initial_value(
              bias_initializer, [units], 0, columns, start, dtype,
              group_size),
          trainable=trainable) if use_bias else None
      record_variable(kernel, 1, units, columns, group_size)
      if bias is not None:
        record_variable(bias, 0, units, columns, group_size)
      logits = _sharded_logits(inputs, kernel, bias, activation, units,
                               start, strategy)
  logger.debug("split dense %s: %d classes over %d shards of %d columns",
               scope.name, units, group_size, columns)
  return logits


def _sharded_logits(inputs, kernel, bias, activation, units, start,
                    strategy):
  """The shard's logits `[k * batch, columns]` of the group's gathered
  `inputs` by its `kernel` (and `bias`) shard, recorded for the lowerings
  that read them."""
  group_size = group_size_of(strategy)
  columns = -(-units // group_size)
  gathered = all_gather(inputs, group_size)
  logits = tf.matmul(gathered, kernel)
  if bias is not None:
    logits = tf.nn.bias_add(logits, bias)
  if activation is not None:
    logits = activation(logits)
  valid = tf.range(columns) + start < units
  info = ShardedLogits(units, columns, group_size, start, valid, strategy)
  _records(create=True).logits[logits.name] = info
  return logits


def _refuse_call_arguments(layer, strategy, args, kwargs):
  if args or kwargs:
    raise ValueError(
        "%s(name=%r) inside %r: call arguments %s are not supported on a "
        "split dense layer; call it with the inputs only." % (
            type(layer).__name__, layer.name, strategy,
            sorted(kwargs) or "given by position"))


def dense_layer_call(call, layer, inputs, *args, **kwargs):
  """Calling a Dense layer object (Keras' or tf.compat.v1.layers'): inside
  a split scope, the sharded `dense` above with the layer's settings; its
  variables are made there, not by the layer. `call` is the layer's own
  __call__."""
  strategy = split_strategy()
  if strategy is None:
    return call(inputs, *args, **kwargs)
  _refuse_call_arguments(layer, strategy, args, kwargs)
  if layer.built or getattr(layer, "_epl_split_lowered", False):
    raise ValueError(
        "%s(name=%r) inside %r: a split dense layer cannot be reused or "
        "built before; call a new layer once inside the split scope." % (
            type(layer).__name__, layer.name, strategy))
  layer._epl_split_lowered = True  # pylint: disable=protected-access
  return dense(None, inputs, layer.units, activation=layer.activation,
               use_bias=layer.use_bias,
               kernel_initializer=layer.kernel_initializer,
               bias_initializer=layer.bias_initializer,
               trainable=layer.trainable, name=layer.name,
               **{k: getattr(layer, k, None) for k in _DENSE_UNSUPPORTED})


def columns_of_whole(weight, axis, units, columns, start, group_size):
  """The shard `[start, start + columns)` along `axis` of a whole weight
  read (zero past its end, as a padded shard)."""
  padding = [[0, 0] for _ in weight.shape]
  padding[axis][1] = columns * group_size - units
  begin = [0] * weight.shape.rank
  begin[axis] = start
  size = weight.shape.as_list()
  size[axis] = columns
  return tf.slice(tf.pad(weight, padding), tf.stack(begin), size)


def _whole_gradient(shard_gradient, sharding, start):
  """The gradient of a whole weight whose shard at `start` has gradient
  `shard_gradient`: zero outside the shard (the gradient of
  `columns_of_whole`)."""
  rank = shard_gradient.shape.rank
  along = tf.one_hot(sharding.axis, rank, dtype=tf.int32)
  after = sharding.columns * (sharding.group_size - 1) - start
  padded = tf.pad(shard_gradient, tf.stack([along * start, along * after],
                                           axis=1))
  size = [-1] * rank
  size[sharding.axis] = sharding.full_size
  return tf.slice(padded, [0] * rank, size)


@dataclasses.dataclass
class TracedShard:
  """The shard of a user's whole eager weight that a split layer of a
  traced TF2 step computes with (`shard_of_whole`). `whole`: the name of
  the read of the weight it was taken from; `sharding`: how the weight is
  cut (ShardedVariable); `gradients`: the names of the shard's gradients
  (one a backward pass through it). The step's copy reads a variable of
  the shard's shape instead and updates it with these gradients
  (epl.runtime.traced_split_weights)."""
  whole: str
  sharding: ShardedVariable
  gradients: list


def shard_of_whole(whole, axis, full_size, columns, start, group_size):
  """The shard `[start, start + columns)` along `axis` of `whole`, a read
  of a user's eager weight in a traced TF2 step (zero past its end, as a
  padded shard), recorded with its gradient (TracedShard): the rewrite
  makes each replica's copy of the weight this shard alone. Its gradient
  here is the shard's, padded with zeros to the whole shape, as
  TensorFlow's own gradient of the slice."""
  record = TracedShard(whole.name, ShardedVariable(
      axis, full_size, columns, group_size), [])

  @tf.custom_gradient
  def shard(value):
    def gradient(upstream):
      upstream = tf.identity(upstream, name="shard_gradient")
      record.gradients.append(upstream.name)
      return _whole_gradient(upstream, record.sharding, start)
    return columns_of_whole(value, axis, full_size, columns, start,
                            group_size), gradient

  part = shard(whole)
  _records(create=True).traced_shards[part.name] = record
  return part


def traced_dense_layer_call(layer, inputs, *args, **kwargs):
  """Calling a built Keras Dense layer inside a split scope while a TF2
  step is traced (eager execution on): the layer's weights are the user's
  eager variables, whole; the trace computes with each shard's columns of
  them (`shard_of_whole`), which the rewrite turns into variables of the
  shard's shape on each shard's device. The logits, their softmax and the
  loss are sharded as in a TF1 graph."""
  strategy = split_strategy()
  _refuse_call_arguments(layer, strategy, args, kwargs)
  given = sorted(k for k in _DENSE_UNSUPPORTED
                 if getattr(layer, k, None) is not None)
  if given:
    raise ValueError(
        "%s(name=%r) inside %r: %s not supported on a split dense layer; "
        "build it outside the split scope or drop them." % (
            type(layer).__name__, layer.name, strategy, ", ".join(given)))
  inputs = tf.convert_to_tensor(inputs)
  if inputs.shape.rank != 2 or inputs.shape[-1] is None:
    raise ValueError(
        "%s(name=%r) inside %r needs inputs of shape [batch, features] with "
        "known features, got %s." % (type(layer).__name__, layer.name,
                                     strategy, inputs.shape))
  group_size = group_size_of(strategy)
  units = layer.units
  columns = -(-units // group_size)
  with tf.name_scope(layer.name):
    start = shard_index() * columns
    kernel = shard_of_whole(tf.convert_to_tensor(layer.kernel), 1, units,
                            columns, start, group_size)
    bias = shard_of_whole(
        tf.convert_to_tensor(layer.bias), 0, units, columns, start,
        group_size) if layer.use_bias else None
    logits = _sharded_logits(tf.cast(inputs, kernel.dtype), kernel, bias,
                             layer.activation, units, start, strategy)
  logger.debug("split dense %s in a traced step: %d classes over %d shards "
               "of %d columns", layer.name, units, group_size, columns)
  return logits


def _sharded_or_raise(logits, what):
  info = sharded_logits_of(logits)
  if info is None:
    raise ValueError(
        "%s inside %r: the logits %r do not come from a dense layer built in "
        "this split scope, and nothing else can be sharded here." % (
            what, split_strategy(), getattr(logits, "name", logits)))
  return info


def _row_losses(labels, logits, info):
  """Cross-entropy of every row of the group's batch, on every shard."""
  labels = tf.cast(all_gather(labels, info.group_size), tf.int32)
  lowest = tf.constant(logits.dtype.min, logits.dtype)
  local_max = tf.reduce_max(tf.where(info.valid, logits, lowest), axis=1)
  # The shift cancels out of the loss: no gradient flows through it.
  global_max = tf.stop_gradient(all_reduce(local_max, info.group_size,
                                           merge_op="Max"))
  shifted = logits - tf.expand_dims(global_max, 1)
  exps = tf.where(info.valid, tf.exp(shifted), tf.zeros_like(shifted))
  log_normalizer = tf.math.log(all_reduce(tf.reduce_sum(exps, axis=1),
                                          info.group_size))
  local_labels = labels - info.start
  in_shard = tf.logical_and(local_labels >= 0, local_labels < info.columns)
  mask = tf.stop_gradient(
      tf.one_hot(tf.where(in_shard, local_labels, tf.zeros_like(labels)),
                 info.columns, dtype=logits.dtype) *
      tf.expand_dims(tf.cast(in_shard, logits.dtype), 1))
  label_logit = all_reduce(tf.reduce_sum(shifted * mask, axis=1),
                           info.group_size)
  return log_normalizer - label_logit


def losses_sparse_softmax_cross_entropy(
    original, labels, logits, weights=1.0, scope=None,
    loss_collection=tf.compat.v1.GraphKeys.LOSSES,
    reduction=tf.compat.v1.losses.Reduction.SUM_BY_NONZERO_WEIGHTS):
  """tf.compat.v1.losses.sparse_softmax_cross_entropy on split logits: the
  weighted loss of the whole shard group's batch."""
  info = sharded_logits_of(logits)
  if info is None:
    return original(labels, logits, weights=weights, scope=scope,
                    loss_collection=loss_collection, reduction=reduction)
  if labels is None:
    raise ValueError("Labels must not be None.")
  with _lowering(logits, info), tf.compat.v1.name_scope(
      scope, "sparse_softmax_cross_entropy_loss", (logits, labels, weights)):
    losses = _row_losses(labels, logits, info)
    if isinstance(weights, tf.Tensor) and weights.shape.rank:
      weights = all_gather(weights, info.group_size)
    loss = tf.compat.v1.losses.compute_weighted_loss(
        losses, weights, loss_collection=loss_collection,
        reduction=reduction)
  return loss


def nn_sparse_softmax_cross_entropy_with_logits(original, labels=None,
                                                logits=None, name=None):
  """tf.nn.sparse_softmax_cross_entropy_with_logits on split logits: the
  loss of each row of the shard group's batch (k x the local batch), on
  every shard."""
  info = sharded_logits_of(logits)
  if info is None:
    return original(labels=labels, logits=logits, name=name)
  with _lowering(logits, info), tf.name_scope(
      name or "SparseSoftmaxCrossEntropyWithLogits"):
    return _row_losses(labels, logits, info)


def _prediction(tensor, info):
  _records(create=True).predictions[tensor.name] = info
  return tensor


def arg_max(original, input, dimension, output_type=tf.int64, name=None):  # pylint: disable=redefined-builtin
  """gen_math_ops.arg_max (behind tf.argmax) on split logits, class axis:
  the class of the largest logit over all shards (the lowest on ties, as
  TF)."""
  info = sharded_logits_of(input)
  axis = tensor_util.constant_value(tf.convert_to_tensor(dimension))
  if info is None:
    return original(input, dimension, output_type=output_type, name=name)
  if axis is None or int(axis) not in (1, -1):
    raise ValueError("tf.argmax over split logits %r works on the class "
                     "axis (1), got %r." % (input.name, dimension))
  with _lowering(input, info), tf.name_scope(name or "ArgMax"):
    lowest = tf.constant(input.dtype.min, input.dtype)
    masked = tf.where(info.valid, input, lowest)
    local_best = tf.reduce_max(masked, axis=1)
    local_class = tf.cast(original(masked, 1, output_type=tf.int32) +
                          info.start, output_type)
    bests = all_gather(tf.expand_dims(local_best, 0), info.group_size)
    classes = all_gather(tf.expand_dims(local_class, 0), info.group_size)
    winner = original(bests, 0, output_type=tf.int32)
    result = tf.gather(tf.transpose(classes), tf.expand_dims(winner, 1),
                       batch_dims=1)[:, 0]
  return _prediction(result, info)


TopK = collections.namedtuple("TopKV2", ["values", "indices"])


def top_kv2(original, input, k, sorted=True, index_type=tf.int32, name=None):  # pylint: disable=redefined-builtin
  """gen_nn_ops.top_kv2 (behind tf.math.top_k) on split logits: the k
  largest over all shards, with their global class ids."""
  info = sharded_logits_of(input)
  if info is None:
    return original(input, k, sorted=sorted, index_type=index_type,
                    name=name)
  with _lowering(input, info), tf.name_scope(name or "TopKV2"):
    lowest = tf.constant(input.dtype.min, input.dtype)
    masked = tf.where(info.valid, input, lowest)
    local = original(masked, k, sorted=True)
    values = all_gather(tf.expand_dims(local.values, 0), info.group_size)
    ids = all_gather(tf.expand_dims(local.indices + info.start, 0),
                     info.group_size)
    # [shards, rows, k] -> [rows, shards * k], shards in class order.
    values = tf.reshape(tf.transpose(values, [1, 0, 2]),
                        [-1, info.group_size * k])
    ids = tf.reshape(tf.transpose(ids, [1, 0, 2]), [-1, info.group_size * k])
    best = original(values, k, sorted=sorted)
    indices = tf.cast(tf.gather(ids, best.indices, batch_dims=1), index_type)
  return TopK(best.values, _prediction(indices, info))


def equal(original, x, y, incompatible_shape_error=True, name=None):
  """gen_math_ops.equal with split predictions on one side: the other side
  (labels of the local batch) is gathered over the shard group."""
  graph_predictions = _records().predictions
  names = [getattr(t, "name", None) for t in (x, y)]
  if not any(n in graph_predictions for n in names):
    return original(x, y, incompatible_shape_error=incompatible_shape_error,
                    name=name)
  info = graph_predictions[names[0] if names[0] in graph_predictions
                           else names[1]]
  with _in_split_scope(info):
    x, y = [t if n in graph_predictions else
            all_gather(tf.convert_to_tensor(t), info.group_size)
            for t, n in zip((x, y), names)]
    return original(x, tf.cast(y, x.dtype), name=name)
