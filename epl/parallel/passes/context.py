"""What the rewrite passes of one graph share.

`RewriteContext` is what every pass may use besides its artifacts: the
graph, its GraphState (op tags, provenance), the plan (made before the
passes run: every decision they apply), the cluster, and the collective
keys, communicators and step counter that the
passes allocate in pass order (so that every worker derives the same
keys). The artifacts the passes hand each other are values of the types
below (and `TrainingSubgraph`, `CapturedStep`); the engine declares them.
"""
import contextlib
import dataclasses

import tensorflow as tf

from epl.ir import names as epl_names
from epl.capture import capture
from epl.communicators import backend
from epl.communicators.collective import CollectiveKeys


class RewriteContext:
  """The graph being rewritten and what every pass may use with it.

  `plan`: the graph's plan (`planner.plan_of`), made before the passes
  run; passes apply its decisions (`plan.decisions`) and read no raw
  configuration. `config` is kept for what is not a decision of the plan
  (settings passed through as they are: sizes, timeouts, logging)."""

  def __init__(self, graph, state, config, cluster, plan):
    self.graph = graph
    self.state = state
    self.config = config
    self.cluster = cluster
    self.plan = plan
    self.keys = CollectiveKeys()
    self.communicators = {}
    self._replicas = None
    self._step_counter = None

  @contextlib.contextmanager
  def building(self, scope=None):
    """Ops built inside are EPL's own, in this graph: not captured, under
    name scope `scope` ("" the root; None keeps the caller's), and waiting
    for none of the control dependencies the caller's ops wait for."""
    with capture.suspended(), self.graph.as_default():
      name_scope = (self.graph.name_scope(scope) if scope is not None
                    else contextlib.nullcontext())
      with name_scope, self.graph.control_dependencies(None):
        yield

  @property
  def replicas(self):
    """The global indices of the replicas this worker builds; the first
    uses the user's own ops."""
    if self._replicas is None:
      self._replicas = self.plan.local_replicas
    return self._replicas

  def step_counter(self):
    """An int64 tensor that counts the steps that read it, run once per
    step on this worker's CPU (a one-shot iterator over 0, 1, 2, ...)."""
    if self._step_counter is None:
      with self.building(epl_names.STEP_COUNTER), \
          tf.device(self.host_device(0)):
        steps = tf.data.Dataset.range(2 ** 62)
        self._step_counter = tf.compat.v1.data.make_one_shot_iterator(
            steps).get_next()
    return self._step_counter

  def taskgraph_index(self, op):
    return self.state.taskgraph_index(op)

  def device(self, local, taskgraph_index):
    """The device of TaskGraph `taskgraph_index` in local replica `local`."""
    return self.plan.device(self.replicas[local], taskgraph_index)

  def host_device(self, local):
    """The CPU of the worker that holds local replica `local`."""
    worker = self.plan.device_workers[self.replicas[local]][0]
    return self.cluster.host_device(worker)

  def communicator(self, taskgraph_index, chain=0, group=0):
    """A communicator over TaskGraph `taskgraph_index` of every replica.

    Collectives of one communicator run in the order they were built;
    each `chain` has its own, independent of the others. Each `group` is a
    collective group of its own (its own NCCL communicator on GPUs), so
    that transfers of different groups may run at the same time.
    """
    key = (taskgraph_index, chain, group)
    if key in self.communicators:
      return self.communicators[key]
    devices = [self.plan.device(r, taskgraph_index)
               for r in range(self.plan.num_replicas)]
    communicator = backend.new_communicator(self, devices, self.replicas,
                                            group=group)
    self.communicators[key] = communicator
    return communicator

  def communicator_class(self):
    """The class of this rewrite's communicators
    (`backend.communicator_class`)."""
    return backend.communicator_class(self)


class Copies:
  """Where every op of the training step has its copies, by local replica
  and micro-batch.

  `clones[i]` maps an op name of replica 0's training step to that op in
  local replica `i` (identity for i = 0, which also holds the ops later
  passes built in replica 0). `micro_batches[m]` maps an op name of one
  micro-batch's forward and backward pass to that op in micro-batch `m` of
  replica 0 (the constants every micro-batch shares map to themselves).
  `accumulations` maps the name of the first tensor of each gradient
  summed over micro-batches (replica 0's) to its `Accumulation`.

  When the micro-batches run as a loop (`accumulation_loop`),
  `micro_batches[m]` (m > 0) holds only micro-batch m's input reads, and
  `loop_values` maps the name of each tensor of the loop that the step
  hands out to its value in every micro-batch (replica 0's, read after the
  loop); it is None when the micro-batches are copies.
  """

  def __init__(self, clones, micro_batches=None):
    self.clones = clones
    self.micro_batches = micro_batches or []
    self.accumulations = {}
    self.loop_values = None
    # replica_op_names cache: local -> (size of clones[local], names).
    self._op_names = {}

  def op(self, local, op):
    """`op`'s copy in local replica `local`."""
    return self.clones[local].get(op.name, op)

  def tensor(self, local, tensor):
    return self.op(local, tensor.op).outputs[tensor.value_index]

  def micro_batch_ops(self, op):
    """`op` in every micro-batch of replica 0; [op] when it is not part
    of a micro-batch."""
    copies = [clones.get(op.name) for clones in self.micro_batches]
    if not copies or copies[0] is None:
      return [op]
    # In a loop, only the input reads have a copy per micro-batch.
    return [copy for copy in copies if copy is not None]

  def micro_batch_tensors(self, tensor):
    """`tensor` in every micro-batch of replica 0; [tensor] when it is not
    part of a micro-batch."""
    if self.loop_values and tensor.name in self.loop_values:
      return list(self.loop_values[tensor.name])
    return [op.outputs[tensor.value_index]
            for op in self.micro_batch_ops(tensor.op)]

  def replica_op_names(self, local):
    """Names of the ops of local replica `local` (a frozenset).

    Cached: gradient aggregation asks once per gradient, and rebuilding the
    set each time made the rewrite quadratic (half of a BERT-Base rewrite).
    The clone maps only grow, so the cache is rebuilt when `clones[local]`
    has grown since.
    """
    clones = self.clones[local]
    cached = self._op_names.get(local)
    if cached is None or cached[0] != len(clones):
      cached = (len(clones), frozenset(op.name for op in clones.values()))
      self._op_names[local] = cached
    return cached[1]


@dataclasses.dataclass(frozen=True)
class Accumulation:
  """A gradient summed over the micro-batches of a step: `parts`, the
  gradient of each micro-batch (replica 0's; a tensor or IndexedSlices),
  and `ops`, the ops that sum them (and divide by their count)."""
  parts: list
  ops: list


@dataclasses.dataclass(frozen=True)
class StepGradients:
  """The recorded gradients as the rewritten graph computes them.

  `raw[k]`: the (gradient, variable op) pairs of the k-th recorded
  `tf.gradients` call; `applied[k]`: those the k-th `apply_gradients`
  applied. They start as captured; passes that replace a gradient tensor
  (mixed precision, the loss scale) hand on new values.
  """
  raw: tuple
  applied: tuple

  @classmethod
  def captured(cls, step):
    return cls(tuple(r.pairs for r in step.gradient_records),
               tuple(r.grads_and_vars for r in step.apply_records))

  def raw_gradients(self):
    """Every recorded gradient of a variable, in the order they were made."""
    return [grad for pairs in self.raw for grad, _ in pairs]

  def remapped(self, remapped):
    """These gradients with the tensors named in `remapped` (old tensor
    name -> new tensor) replaced."""
    return StepGradients(
        tuple(tuple(remap_pairs(pairs, remapped)) for pairs in self.raw),
        tuple(tuple(remap_pairs(pairs, remapped)) for pairs in self.applied))


def remap_pairs(pairs, remapped):
  """(gradient, variable) `pairs` with the gradient tensors named in
  `remapped` (old tensor name -> new tensor) replaced."""
  def new(grad):
    if grad is None:
      return None
    if isinstance(grad, tf.IndexedSlices):
      return tf.IndexedSlices(new(grad.values), new(grad.indices),
                              grad.dense_shape)
    return remapped.get(grad.name, grad)
  return [(new(g), v) for g, v in pairs]
