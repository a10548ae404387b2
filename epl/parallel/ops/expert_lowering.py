"""Expert parallelism (MoE) inside `epl.split(k)`: weights sharded on the
expert axis, tokens exchanged by all-to-all.

- `add_weight` (Keras `Layer.add_weight`) inside a split scope makes the
  shard `[E / k, ...]` of a weight `[E, ...]` (E must divide by k); its
  initial value is the shard's slice of the unsharded initial value.
- `einsum` inside a split scope is recognised from its equation and the
  operands' shapes (the GShard/FastNN pattern):
  * dispatch, `EGCM,EMH->EGCH`: an expert-sharded weight (dim 0 = E / k)
    meets tokens whose same letter has size E. The tokens go through an
    all-to-all (experts block j to shard j) and the blocks received are
    laid side by side on the capacity axis: `[E / k, G, k * C, M]`.
  * expert, `EGCH,EHM->EGCM`: an expert-sharded weight meets local expert
    activations (the same size E / k): computed as is.
  * combine, `GSEC,EGCM->GSM`: no sharded weight; local expert outputs
    `[E / k, G, k * C, M]` meet a tensor with E experts and capacity C,
    and the experts axis is summed over: the outputs go back by the
    inverse exchange first.
  Any other einsum inside split is an error naming it.

In a TF2 step traced by tf.function (eager execution on), Keras has made
the weights eagerly, whole: `traced_einsum` takes each shard's E / k
experts of a weight it reads (which the rewrite makes a variable of that
shape), and the einsums are then lowered as above.

The experts axis of the tokens (dispatch) or of the tensor met at combine
may be unknown when the graph is built (a batch dimension used as the
experts axis): it is then taken as E, and a run-time check fails, naming
the einsum and the sizes, when it is not. The dispatch einsum's result
has the static size E / k of the weight it met, so the expert einsum
after it is recognised as such.
"""
import dataclasses
import logging
import re

import tensorflow as tf

from epl.ir.op_types import VARIABLE_TYPES
from epl.parallel.ops import split_lowering

logger = logging.getLogger("epl")


# Compared by identity: `operands.index` must not compare tensors (a
# TF2 tensor's == is element-wise).
@dataclasses.dataclass(eq=False)
class _Operand:
  tensor: object
  sharded_weight: bool
  letters: str


def _resolve_initializer(initializer, dtype):
  if initializer is None:
    initializer = "glorot_uniform" if dtype.is_floating else "zeros"
  if not callable(initializer):
    initializer = tf.keras.initializers.get(initializer)
  return initializer


def add_weight(original, layer, name=None, shape=None, dtype=None,
               initializer=None, *args, **kwargs):
  """Layer.add_weight: the shard `[E / k, ...]` inside a split scope."""
  strategy = split_lowering.split_strategy()
  if strategy is None or not shape:
    return original(layer, name, shape, dtype, initializer, *args, **kwargs)
  group_size = split_lowering.group_size_of(strategy)
  full_shape = [tf.compat.dimension_value(d) for d in shape]
  if None in full_shape:
    raise ValueError(
        "%s.add_weight(%r, shape=%s) inside %r: a sharded weight needs a "
        "fully known shape. Give every dimension a size." % (
            type(layer).__name__, name, full_shape, strategy))
  if full_shape[0] % group_size:
    raise ValueError(
        "%s.add_weight(%r, shape=%s) inside %r: dimension 0 (%d experts) "
        "does not divide by the %d shards. Use a multiple of %d." % (
            type(layer).__name__, name, full_shape, strategy, full_shape[0],
            group_size, group_size))
  columns = full_shape[0] // group_size
  dtype = tf.as_dtype(dtype or layer.dtype or tf.float32)
  full_initializer = _resolve_initializer(initializer, dtype)

  def shard_initializer(shape, dtype=dtype, **_):
    start = split_lowering.shard_index() * columns
    return split_lowering.sharded_initial_value(
        full_initializer, full_shape, 0, columns, start, dtype, group_size)

  variable = original(layer, name, [columns] + full_shape[1:], dtype,
                      shard_initializer, *args, **kwargs)
  split_lowering.record_variable(
      variable, 0, full_shape[0], columns, group_size)
  return variable


def _source_variable(tensor):
  """The variable op a tensor reads, through reads, identities and casts."""
  while tensor.op.type in ("Identity", "ReadVariableOp", "Cast"):
    if tensor.op.type == "ReadVariableOp":
      return tensor.op.inputs[0].op
    tensor = tensor.op.inputs[0]
  if tensor.op.type in VARIABLE_TYPES:
    return tensor.op
  return None


def _operands(equation, inputs, expert_sharded):
  """The einsum's operands, each `expert_sharded(tensor)`: the tensor to
  compute with and whether it is a weight sharded on the experts axis."""
  spec = equation.replace(" ", "")
  match = re.fullmatch(r"([a-zA-Z]+),([a-zA-Z]+)->([a-zA-Z]*)", spec)
  if not match:
    return None, None
  return [_Operand(*expert_sharded(tensor), letters=letters)
          for tensor, letters in zip(inputs, match.groups()[:2])
          ], match.group(3)


def _size(operand, letter):
  """The static size of `letter`'s axis of `operand`; None if unknown."""
  return tf.compat.dimension_value(
      operand.tensor.shape[operand.letters.index(letter)])


def _dim(tensor, axis):
  static = tf.compat.dimension_value(tensor.shape[axis])
  return static if static is not None else tf.shape(tensor)[axis]


def _with_experts(tensor, axis, experts, equation, strategy, group_size):
  """`tensor`, checked at run time to have `experts` entries on `axis`
  (its experts axis, unknown when the graph was built)."""
  check = tf.debugging.assert_equal(
      tf.shape(tensor)[axis], experts, message=(
          "tf.einsum(%r) inside %r: the experts axis (dimension %d) of %s, "
          "unknown when the graph was built, must hold all %d experts (%d "
          "shards of %d, from the sharded weights' shape) at run time" % (
              equation, strategy, axis, tensor.name, experts, group_size,
              experts // group_size)))
  with tf.control_dependencies([check]):
    return tf.identity(tensor)


def _to_local_experts(tokens, group_size):
  """[E, G, C, M] -> all-to-all -> [E / k, G, k * C, M] (source-major)."""
  # E from the tokens, even where the weight gives E / k statically: a
  # reshape to a static E / k would let grappler infer an unknown E and
  # fold the run-time check of `_with_experts` away.
  experts, groups, capacity = [_dim(tokens, i) for i in range(3)]
  rest = tokens.shape[3:].as_list()
  received = split_lowering.all_to_all(tokens, group_size)
  blocks = tf.reshape(received, [group_size, experts // group_size, groups,
                                 capacity] + rest)
  local = tf.transpose(blocks, [1, 2, 0, 3] + list(range(4, 4 + len(rest))))
  return tf.reshape(local, [experts // group_size, groups,
                            group_size * capacity] + rest)


def _to_owners(local, group_size):
  """The inverse of `_to_local_experts`."""
  experts, groups, capacity = [_dim(local, i) for i in range(3)]
  rest = local.shape[3:].as_list()
  capacity //= group_size
  blocks = tf.reshape(local, [experts, groups, group_size, capacity] + rest)
  blocks = tf.transpose(blocks, [2, 0, 1, 3] + list(range(4, 4 + len(rest))))
  return split_lowering.all_to_all(
      tf.reshape(blocks, [group_size * experts, groups, capacity] + rest),
      group_size)


def _unknown(equation, strategy, why):
  return ValueError(
      "tf.einsum(%r) inside %r fits no sharded pattern (%s). Inside "
      "epl.split, einsum is for MoE: dispatch 'EGCM,EMH->EGCH', expert "
      "'EGCH,EHM->EGCM' (E-sharded weights from add_weight) and combine "
      "'GSEC,EGCM->GSM'; build other einsums outside the split scope." % (
          equation, strategy, why))


def einsum(original, equation, *inputs, **kwargs):
  """tf.einsum inside a split scope of a TF1 graph: its expert weights are
  the shards `add_weight` made."""
  strategy = split_lowering.split_strategy()
  if strategy is None:
    return original(equation, *inputs, **kwargs)
  sharded = split_lowering.sharded_variables_in(
      tf.compat.v1.get_default_graph())

  def recorded_shard(value):
    tensor = tf.convert_to_tensor(value)
    source = _source_variable(tensor)
    info = sharded.get(source.name) if source is not None else None
    return tensor, info is not None and info.axis == 0
  return _lowered(original, equation, inputs, kwargs, strategy,
                  recorded_shard)


def _reads_variable(tensor):
  """Whether `tensor` is a variable's value (through identities and
  casts): in a traced step, a read of a captured eager variable."""
  while tensor.op.type in ("Identity", "Cast"):
    tensor = tensor.op.inputs[0]
  return tensor.op.type == "ReadVariableOp"


def traced_einsum(original, equation, *inputs, **kwargs):
  """tf.einsum inside a split scope while a TF2 step is traced (eager
  execution on): the expert weights are the user's eager variables
  `[E, ...]`, whole; the trace computes with each shard's E / k experts
  of them (`split_lowering.shard_of_whole`), which the rewrite turns into
  variables of the shard's shape on each shard's device, and the tokens
  go to them as in a TF1 graph."""
  strategy = split_lowering.split_strategy()
  if strategy is None:
    return original(equation, *inputs, **kwargs)
  group_size = split_lowering.group_size_of(strategy)

  def experts_of_shard(value):
    tensor = tf.convert_to_tensor(value)
    if not _reads_variable(tensor) or not tensor.shape.rank:
      return tensor, False
    experts = tf.compat.dimension_value(tensor.shape[0])
    if experts is None or experts % group_size:
      raise ValueError(
          "tf.einsum(%r) inside %r reads the variable %s of shape %s: "
          "dimension 0 (its experts) must be known and divide by the %d "
          "shards. Use a multiple of %d experts." % (
              equation, strategy, value.name, tensor.shape, group_size,
              group_size))
    columns = experts // group_size
    logger.info("epl: tf.einsum(%r) inside %r in a traced step: each shard "
                "computes with %d of the %d experts of %s (its shard, held "
                "by its device alone)", equation, strategy, columns,
                experts, value.name)
    with tf.name_scope("experts_of_shard"):
      return split_lowering.shard_of_whole(
          tensor, 0, experts, columns, split_lowering.shard_index() * columns,
          group_size), True
  return _lowered(original, equation, inputs, kwargs, strategy,
                  experts_of_shard)


def _lowered(original, equation, inputs, kwargs, strategy, expert_sharded):
  """The einsum's dispatch, expert or combine lowering."""
  group_size = split_lowering.group_size_of(strategy)
  operands, output_letters = _operands(equation, inputs, expert_sharded)
  if operands is None or len(operands) != 2:
    raise _unknown(equation, strategy, "two operands expected")
  weights = [o for o in operands if o.sharded_weight]
  if len(weights) == 1:
    weight = weights[0]
    other = operands[1 - operands.index(weight)]
    expert = weight.letters[0]
    if expert not in other.letters or other.letters[0] != expert:
      raise _unknown(equation, strategy, "the experts axis %r must lead "
                     "both operands" % expert)
    local, full = _size(weight, expert), _size(other, expert)
    if full == local:
      return original(equation, *[o.tensor for o in operands], **kwargs)
    tokens = other.tensor
    if full is None:
      tokens = _with_experts(tokens, 0, local * group_size, equation,
                             strategy, group_size)
    elif full != local * group_size:
      raise _unknown(equation, strategy, "%d experts against %d shards of "
                     "%d" % (full, group_size, local))
    exchanged = _to_local_experts(tokens, group_size)
    args = [exchanged if o is other else o.tensor for o in operands]
    return original(equation, *args, **kwargs)
  if weights:
    raise _unknown(equation, strategy, "two sharded weights")
  for local_operand in operands:
    other = operands[1 - operands.index(local_operand)]
    expert = local_operand.letters[0]
    if expert not in other.letters or expert in output_letters:
      continue
    local, full = _size(local_operand, expert), _size(other, expert)
    if local is None or full not in (None, local * group_size):
      continue
    args = [o.tensor for o in operands]
    if full is None:
      axis = other.letters.index(expert)
      args[operands.index(other)] = _with_experts(
          other.tensor, axis, local * group_size, equation, strategy,
          group_size)
    args[operands.index(local_operand)] = _to_owners(local_operand.tensor,
                                                     group_size)
    return original(equation, *args, **kwargs)
  raise _unknown(equation, strategy, "no expert-sharded operand")
