"""State shared by the rewrite passes of one graph."""
import dataclasses
from typing import Dict, List

import tensorflow as tf

from epl.communicators import backend
from epl.communicators.collective import CollectiveKeys


@dataclasses.dataclass
class RewriteContext:
  """The graph being rewritten, its plan, and the replicas built so far.

  `replicas` are the global indices of the replicas this worker builds; the
  first uses the user's own ops. `clones[i]` maps an original op name of the
  training subgraph to that op in local replica `i` (identity for i = 0).
  `micro_batches[m]` maps an original op name of one micro-batch's forward
  and backward pass to that op in micro-batch `m` of replica 0 (the
  constants every micro-batch shares map to themselves).
  `gradient_points[k]` are the (gradient, variable) pairs of the k-th
  apply_gradients call that the replicas all-reduce; passes that put ops
  between gradient and update (micro-batch accumulation) keep them current.
  """
  graph: object
  state: object
  plan: object
  config: object
  cluster: object
  subgraph: object
  replicas: List[int]
  clones: List[Dict[str, object]] = dataclasses.field(default_factory=list)
  user_devices: Dict[str, str] = dataclasses.field(default_factory=dict)
  substitutes: Dict[str, object] = dataclasses.field(default_factory=dict)
  keys: CollectiveKeys = dataclasses.field(default_factory=CollectiveKeys)
  communicators: Dict[int, object] = dataclasses.field(default_factory=dict)
  micro_batches: List[Dict[str, object]] = dataclasses.field(
      default_factory=list)
  gradient_points: List[list] = dataclasses.field(default_factory=list)
  # Gradient checkpointing: replica 0's recomputed ops, one list per
  # segment that backward recomputes at once (memory estimate).
  recomputed_segments: List[list] = dataclasses.field(default_factory=list)
  _step_counter: object = dataclasses.field(default=None, repr=False)
  # replica_op_names cache: local -> (size of clones[local], names).
  _op_names: Dict[int, tuple] = dataclasses.field(default_factory=dict,
                                                  repr=False)

  def op(self, local, op):
    return self.clones[local].get(op.name, op)

  def tensor(self, local, tensor):
    return self.op(local, tensor.op).outputs[tensor.value_index]

  def micro_batch_tensors(self, tensor):
    """`tensor` in every micro-batch of replica 0; [tensor] when it is not
    part of a micro-batch."""
    copies = [clones.get(tensor.op.name) for clones in self.micro_batches]
    if not copies or copies[0] is None:
      return [tensor]
    return [op.outputs[tensor.value_index] for op in copies]

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

  def step_counter(self):
    """An int64 tensor that counts the steps that read it, run once per
    step on this worker's CPU (a one-shot iterator over 0, 1, 2, ...)."""
    if self._step_counter is None:
      with self.graph.as_default(), self.graph.name_scope(
          "EPL_STEP_COUNTER/"), self.graph.control_dependencies(None), \
          tf.device(self.host_device(0)):
        steps = tf.data.Dataset.range(2 ** 62)
        self._step_counter = tf.compat.v1.data.make_one_shot_iterator(
            steps).get_next()
    return self._step_counter

  def taskgraph_index(self, op):
    taskgraph = self.state.taskgraph_of(op)
    return taskgraph.index if taskgraph is not None else 0

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
