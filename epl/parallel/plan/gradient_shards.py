"""How zero.level "v3" makes each partitioned weight's shard gradients,
and why: a decision of the plan per partitioned variable, taken with the
weight partition (`weight_partition.decide`), applied by
`zero_gradient_shards` and printed by epl-plan.

Shard s's gradient is the sum over the N local replicas of rows s of
each replica's gradient. Two routes make it:

- FROM_GRADIENTS: each replica makes its gradient's rows of each shard
  and sends them to the shard's replica, which sums them. A replica sends
  (N-1) shards of `columns` x `out` elements per micro-batch:
  M·(N-1)·columns·out·g bytes a step (g: the gradient's element bytes;
  columns = ceil(in / N)).
- FROM_ACTIVATIONS (a dense kernel's gradient `MatMul(x, dy,
  transpose_a)` that only its update reads): shard s's replica makes the
  sum as one MatMul of columns s of every replica's `x` [R, in] with its
  `dy` [R, out], over the replicas' (and micro-batches') concatenated
  rows. A replica sends each other replica its slice of `x` and its whole
  `dy`: (N-1)·R·(columns·a + out·d) bytes a step (R: its rows a step,
  M micro-batches of the batch the user's step reads; a, d: the element
  bytes of x and dy).

Where the rewrite puts ops between the MatMul and the update (amp.level
O1's cast back to float32, loss scaling's unscaling), the shards come
from the gradient. Otherwise the plan takes the route that moves fewer
bytes (FROM_ACTIVATIONS on a tie): few rows against a wide weight favour
the activations, many rows the gradient's. Memory follows the same comparison, so it needs no rule
of its own: a route's transient bytes on a replica are what it sends and
receives plus what it builds them from (the N shard products of
FROM_GRADIENTS, as big as the full gradient; the N replicas'
concatenated rows of FROM_ACTIVATIONS), both proportional to the bytes
compared. When R is not static (a batch of unknown size), the bytes
cannot be compared: the plan takes FROM_ACTIVATIONS, because ZeRO v3 is
asked for to save memory and that route never makes a full-size gradient
on a replica, and says so in its reason.
"""
import dataclasses
import enum
from typing import Optional

from epl.ir.kernel_gradients import is_kernel_gradient, product_behind
from epl.parallel.plan.decisions import Decision, LossScaling, Precision


class GradientShards(enum.Enum):
  """How zero.level v3 makes one partitioned weight's shard gradients."""
  FROM_ACTIVATIONS = "gradient shards from activations"
  FROM_GRADIENTS = "gradient shards from each replica's gradient"


@dataclasses.dataclass(frozen=True)
class GradientRoute:
  """The route's Decision and the bytes a replica sends a step by each
  route: `from_gradients`, and `from_activations` (None: the gradient is
  not a kernel's MatMul that only its update reads, or its rows are not
  static)."""
  decision: Decision
  from_gradients: int
  from_activations: Optional[int]


def _bytes(tensor):
  return tensor.dtype.base_dtype.size


def _recast(decisions):
  """Why the rewrite puts ops between every kernel's gradient MatMul and
  its update (amp.level O1 runs the MatMul in half precision and casts
  its gradient back; loss scaling unscales it), or None."""
  if decisions.precision.value is not Precision.FULL:
    return ("amp.level O1 runs its gradient's MatMul in %s and casts the "
            "gradient back for the update" % decisions.precision.value.value)
  if decisions.loss_scaling.value is not LossScaling.NONE:
    return "loss scaling unscales its gradient before the update"
  return None


def route(shape, grad, update, plan):
  """The GradientRoute of a partitioned variable of TensorShape `shape`
  (fully defined, first axis sharded over `plan`'s local replicas), whose
  gradient `grad` its `update` ops read."""
  replicas, micro_batches = len(plan.local_replicas), plan.num_micro_batch
  dims = shape.as_list()
  columns, out = -(-dims[0] // replicas), shape[1:].num_elements()
  from_gradients = (micro_batches * (replicas - 1) * columns * out *
                    _bytes(grad))
  product = product_behind(grad, {op.name for op in update})
  if len(dims) != 2 or product is None or not is_kernel_gradient(
      product[0]):
    return GradientRoute(Decision(
        GradientShards.FROM_GRADIENTS, "its gradient is not a dense "
        "kernel's MatMul that only its update reads"), from_gradients, None)
  recast = _recast(plan.decisions)
  if recast:
    return GradientRoute(Decision(GradientShards.FROM_GRADIENTS, recast),
                         from_gradients, None)
  x, dy = product[0].inputs
  # as_list: a plain int or None also under TF1 behaviour (Dimension).
  rows = x.shape.as_list()[0] if x.shape.rank == 2 else None
  if rows is None:
    return GradientRoute(Decision(
        GradientShards.FROM_ACTIVATIONS, "its batch size is not static, so "
        "the bytes of the two routes cannot be compared; this route never "
        "makes a full-size gradient on a replica (v3 is for memory)"),
                         from_gradients, None)
  # Each micro-batch reads its own batch of the user's size.
  rows *= micro_batches
  from_activations = (replicas - 1) * rows * (
      columns * _bytes(x) + out * _bytes(dy))
  compared = ("a replica sends %d bytes a step from %d activation rows "
              "against %d of gradient rows" % (
                  from_activations, rows, from_gradients))
  if from_activations <= from_gradients:
    return GradientRoute(Decision(GradientShards.FROM_ACTIVATIONS, compared),
                         from_gradients, from_activations)
  return GradientRoute(Decision(GradientShards.FROM_GRADIENTS, compared),
                       from_gradients, from_activations)
