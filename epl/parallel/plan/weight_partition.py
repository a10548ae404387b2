"""Which trained variables zero.level "v3" partitions into shards, and why:
a decision of the plan, taken once from what capture recorded (the
gradient and apply records, the apply ops' phase, the split lowerings'
records) before the passes run; `zero_weights` applies it and `epl-plan`
prints it.

A variable is partitioned when it has a dense gradient, at least
zero.min_partition_size elements, a known shape of rank 1 or more, and an
update of its own (ops `apply_gradients` built for it alone) that is
elementwise: the fused dense apply kernels of the tf.compat.v1.train
optimizers, or elementwise ops on the variable, its slots, its gradient
and scalars (Google BERT's AdamW); no norm of the whole variable (LAMB,
LARS). Split variables belong to their shard group.

For each partitioned variable the plan also decides how its shard
gradients are made (`gradient_shards`: from the replicas' activations or
from each replica's gradient rows, whichever moves fewer bytes).
"""
import dataclasses
import enum
from typing import Tuple

import tensorflow as tf

from epl.ir import variables as ir_variables
from epl.ir.phase import Phase
from epl.parallel.plan.balance import variable_size
from epl.parallel.plan.decisions import Decision
from epl.parallel.plan import gradient_shards

# Op types an update may have and still apply shard by shard: elementwise
# ops (on the variable, its slots and gradient, and scalars), variables,
# their reads and writes; the fused dense apply kernels (Apply*,
# ResourceApply*; "Sparse" ones excepted) are elementwise too. No reduction:
# an update that takes a norm of the whole variable (LAMB, LARS) cannot.
_ELEMENTWISE_UPDATE_TYPES = frozenset(
    ["VarHandleOp", "VariableV2", "Variable", "ReadVariableOp", "Identity",
     "Cast", "Const", "NoOp", "Assign", "AssignAdd", "AssignSub",
     "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
     "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Neg",
     "Sqrt", "Rsqrt", "Square", "Pow", "Abs", "Sign", "Exp", "Log",
     "Reciprocal", "Maximum", "Minimum", "Select", "SelectV2", "ZerosLike",
     "OnesLike"])


class WeightSharding(enum.Enum):
  """What zero.level v3 does with one trained variable."""
  PARTITIONED = "partitioned"
  SMALL = "whole, small"
  SPARSE = "whole, sparse gradient"
  NOT_ELEMENTWISE = "whole, update not elementwise"
  SHARED_UPDATE = "whole, update shared"
  SPLIT = "its split group's"


@dataclasses.dataclass(frozen=True)
class WeightPartition:
  """The WeightSharding of every trained variable, with its reason:
  ((variable op name, Decision), ...) in the order capture recorded;
  `min_partition_size`, the size under which variables stay whole;
  `routes`, ((variable op name, gradient_shards.GradientRoute), ...) of
  the partitioned ones."""
  variables: Tuple[Tuple[str, Decision], ...]
  min_partition_size: int
  routes: Tuple[Tuple[str, gradient_shards.GradientRoute], ...] = ()

  def names(self, sharding):
    """The variables decided `sharding`, in order."""
    return [name for name, decision in self.variables
            if decision.value is sharding]

  def of(self, name):
    """The Decision for variable op `name` (KeyError: not trained)."""
    return dict(self.variables)[name]

  def route_of(self, name):
    """The GradientRoute of partitioned variable op `name` (KeyError: not
    partitioned)."""
    return dict(self.routes)[name]

  def lines(self, notable_only=False):
    """One line per variable and one per partitioned variable's gradient
    route, for people (`epl-plan`); `notable_only`: one line, how many
    variables each WeightSharding and GradientShards has (the rewrite's
    log)."""
    if notable_only:
      counts = [(kind.value, len(self.names(kind))) for kind in
                WeightSharding] + [
                    (kind.value, sum(r.decision.value is kind
                                     for _, r in self.routes))
                    for kind in gradient_shards.GradientShards]
      return ["v3 weights: " + ", ".join(
          "%s %d" % (label, count) for label, count in counts if count)]
    return (["v3 weight %s: %s" % (name, decision.describe())
             for name, decision in self.variables] +
            ["v3 gradient shards of %s: %s" % (
                name, route.decision.describe())
             for name, route in self.routes])


def not_elementwise(update, variable, gradients):
  """Why the `update` ops of `variable` cannot apply to one shard at a time
  with shards of its gradient (tensor names `gradients`): op types that
  are not elementwise, and tensors other than the variable, its gradients
  and scalars that the update reads from outside itself (they have the
  full shape). Empty when it can."""
  names = {op.name for op in update}
  reasons = sorted({op.type for op in update
                    if op.type not in _ELEMENTWISE_UPDATE_TYPES and not (
                        op.type.startswith(("Apply", "ResourceApply")) and
                        "Sparse" not in op.type)})
  for op in update:
    outside = [t for t in op.inputs if t.op.name not in names and
               t.op is not variable and t.name not in gradients]
    if op.type == "Const":
      outside = list(op.outputs)
    for tensor in outside:
      if tensor.shape.num_elements() != 1 and tensor.shape.rank != 0:
        reasons.append("reads %s %s" % (tensor.name, tensor.shape))
  return reasons


def _trained(state):
  """{variable op name: (variable op, [its gradients])} of the captured
  gradient and apply records, in the order recorded."""
  trained = {}
  for pairs in ([r.pairs for r in state.gradient_records] +
                [r.grads_and_vars for r in state.apply_records]):
    for grad, variable in pairs:
      trained.setdefault(variable.name, (variable, []))[1].append(grad)
  return trained


def _shape(variable):
  return tf.TensorShape(variable.get_attr("shape") if variable.type ==
                        "VarHandleOp" else variable.outputs[0].shape)


def _sharding(variable, grads, update, minimum):
  """The Decision for `variable`, not split, whose gradients are `grads`
  and whose own update ops are `update`."""
  if any(isinstance(g, tf.IndexedSlices) for g in grads):
    return Decision(WeightSharding.SPARSE, "its gradient is sparse (an "
                    "embedding lookup); communication.sparse_as_dense "
                    "makes it dense")
  shape = _shape(variable)
  if not shape.is_fully_defined() or shape.rank == 0 or (
      variable_size(variable) < minimum):
    return Decision(WeightSharding.SMALL, "%s has fewer than "
                    "zero.min_partition_size = %d elements" % (
                        shape, minimum))
  if not update:
    return Decision(WeightSharding.SHARED_UPDATE, "its update is built "
                    "together with other variables' (one op for several)")
  blocking = not_elementwise(update, variable, {g.name for g in grads})
  if blocking:
    return Decision(WeightSharding.NOT_ELEMENTWISE, "its update cannot "
                    "apply shard by shard: %s" % ", ".join(blocking))
  return Decision(WeightSharding.PARTITIONED, "%s, %d elements, dense "
                  "gradient, elementwise update" % (
                      shape, variable_size(variable)))


def decide(graph, state, plan, minimum):
  """The WeightPartition of `graph` (its GraphState `state`) under `plan`,
  with zero.min_partition_size `minimum`."""
  trained = _trained(state)
  apply_ops = [op for op in graph.get_operations()
               if state.phase_of(op) is Phase.APPLY]
  updates = ir_variables.updates_of(
      apply_ops, [(g, v) for v, grads in trained.values() for g in grads],
      trained)
  decided, routes = [], []
  for name, (variable, grads) in trained.items():
    taskgraph = plan.taskgraphs[state.taskgraph_index(variable)]
    if taskgraph.kind == "split" or name in state.split.variables:
      decided.append((name, Decision(
          WeightSharding.SPLIT, "it is built under epl.split: each replica "
          "holds and updates its shard already")))
      continue
    decided.append((name, _sharding(variable, grads, updates[name],
                                    minimum)))
    if decided[-1][1].value is WeightSharding.PARTITIONED:
      routes.append((name, gradient_shards.route(
          _shape(variable), grads[-1], updates[name], plan)))
  return WeightPartition(tuple(decided), minimum, tuple(routes))
