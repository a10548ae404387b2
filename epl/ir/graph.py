"""The original EPL's IR, as a read-only view of what EPL keeps.

`epl.Graph.get()` answers the questions tools written against the original
ask (`taskgraphs`, `operations`, `num_stages`, `pipeline_enabled`, the
copies of an op in the other replicas and micro-batches), from the state
EPL already keeps: the op tags of `epl.ir.graph_state`, the cluster's
VirtualDevices (the plan) and, once the graph is rewritten, the rewrite's
maps from each op to its copies (`GraphState.rewrite_result.copies`:
`clones[r]` per local replica, `micro_batches[m]` of replica 0). Nothing
here changes the graph or EPL's state: the original's editing calls
(`set_model_phase`, `update_input`, ...) are not part of the view.

Before the rewrite, every op is in replica 0 and micro-batch 0, as in the
original before it cloned them.
"""
import weakref

import tensorflow as tf

from epl import collections as epl_collections
from epl.env import Env
from epl.ir import control_flow
from epl.ir.graph_state import state_of
from epl.ir.phase import ModelPhase, Phase

_MODEL_PHASES = {
    Phase.FORWARD: ModelPhase.FORWARD,
    Phase.BACKWARD: ModelPhase.BACKWARD,
    Phase.APPLY: ModelPhase.APPLY,
    Phase.OTHER: ModelPhase.OTHER,
}
# The original EPL defined GraphKeys in epl/ir/graph.py, and its users
# import it from there.
GraphKeys = epl_collections.GraphKeys
# One view per graph state, so that `Graph.get()` is the same object for
# the same graph, as in the original.
_views = weakref.WeakKeyDictionary()


class Graph:
  """The EPL view of one tf.Graph: `epl.Graph.get()`."""

  def __init__(self, tf_graph, state):
    self.primitive_obj = tf_graph
    self._state = state
    self._taskgraphs = {}

  @classmethod
  def get(cls, may_create=False):
    """The view of the default graph; None before `epl.init` or, unless
    `may_create`, while EPL has seen nothing of the graph."""
    tf_graph = tf.compat.v1.get_default_graph()
    state = state_of(tf_graph, create=may_create)
    if state is None:
      return None
    view = _views.get(state)
    if view is None:
      view = _views[state] = cls(tf_graph, state)
    return view

  @property
  def taskgraphs(self):
    """The TaskGraphs, in stage order."""
    return [self._view_of(t) for t in self._state.taskgraphs]

  def _view_of(self, taskgraph):
    if taskgraph is None:
      return None
    view = self._taskgraphs.get(taskgraph.index)
    if view is None:
      view = self._taskgraphs[taskgraph.index] = TaskGraph(self, taskgraph)
    return view

  def taskgraph_of(self, op):
    """The TaskGraph of tf.Operation `op`; None for ops outside every
    one."""
    return self._view_of(self._state.taskgraph_of(op))

  def phase_of(self, op):
    """The ModelPhase of tf.Operation `op`."""
    return _MODEL_PHASES[self._state.phase_of(op)]

  def micro_batch_of(self, op):
    """The micro-batch of tf.Operation `op` (0 for ops that run once per
    step)."""
    return self._state.micro_batch_of(op) or 0

  @property
  def num_stages(self):
    return len(self._state.taskgraphs)

  def get_pipeline_config(self):
    """The `pipeline` section of the config (num_micro_batch, strategy)."""
    return Env.get().config.pipeline

  @property
  def pipeline_enabled(self):
    """Several stages and several micro-batches (the original's rule)."""
    return self.num_stages > 1 and (
        self.get_pipeline_config().num_micro_batch > 1)

  @property
  def operations(self):
    """{name: Operation} of every op of the graph."""
    return _Operations(self)

  def get_operation_by_name(self, name):
    """The Operation `name`, or None."""
    try:
      return Operation(self, self.primitive_obj.get_operation_by_name(name))
    except KeyError:
      return None

  def get_tensor_by_name(self, name):
    """The Tensor `name` ("op:index"), or None."""
    try:
      return Tensor(self, self.primitive_obj.get_tensor_by_name(name))
    except (KeyError, ValueError):
      return None

  def get_collection(self, key):
    """The tensors of EPL collection `key` (an `epl.GraphKeys` name) in
    this graph, as `epl.get_collection` gives them."""
    return epl_collections.get_collection(key, self.primitive_obj)

  def _wrap(self, obj):
    """`obj` (a tf or EPL Operation or Tensor) as this view's object."""
    if isinstance(obj, (Operation, Tensor)):
      return obj
    if isinstance(obj, tf.Operation):
      return Operation(self, obj)
    if isinstance(obj, tf.Tensor):
      return Tensor(self, obj)
    raise ValueError("Expected an Operation or a Tensor, got %r." % (obj,))

  # The rewrite's copies.

  def _rewrite(self):
    return self._state.rewrite_result

  def _local_replica_of(self, op):
    """(local replica index, name of the op it copies) of `op`."""
    result = self._rewrite()
    if result is not None:
      for local in range(1, len(result.context.replicas)):
        if op.name in result.copies.replica_op_names(local):
          origin = next(name for name, clone in result.copies.clones[local].items()
                        if clone.name == op.name)
          return local, origin
    return 0, op.name

  def replica_ops(self, local):
    """The tf.Operations of local replica `local`."""
    result = self._rewrite()
    if result is None:
      return self.primitive_obj.get_operations() if local == 0 else []
    if local >= len(result.context.replicas):
      return []
    if local > 0:
      return list(result.copies.clones[local].values())
    others = set()
    for other in range(1, len(result.context.replicas)):
      others |= result.copies.replica_op_names(other)
    return [op for op in self.primitive_obj.get_operations()
            if op.name not in others]

  def get_local_replicas(self, obj):
    """The copies of `obj` (an Operation or Tensor of replica 0) in the
    other local replicas, in order; [] for what is not replicated."""
    if obj is None:
      return []
    obj = self._wrap(obj)
    result = self._rewrite()
    if result is None:
      return []
    op = _op_of(obj)
    copies = []
    for local in range(1, len(result.context.replicas)):
      clone = result.copies.clones[local].get(op.name)
      if clone is None:
        break
      copies.append(clone)
    return self._like(obj, copies)

  def get_local_micro_batches(self, obj):
    """The copies of `obj` (an Operation or Tensor of micro-batch 0 of
    any local replica) in micro-batches 1.. of that replica, in order;
    [] for what runs once per step. Raises for an op of the micro-batch
    loop (pipeline.accumulation "loop"), whose micro-batches are the
    iterations of one op, not copies."""
    obj = self._wrap(obj)
    result = self._rewrite()
    if result is None:
      return []
    if control_flow.in_rewritten_loop(_op_of(obj), self._state.provenance):
      raise ValueError(
          "%r runs once per micro-batch inside the micro-batch loop "
          "(pipeline.accumulation \"loop\"): its micro-batches are the "
          "iterations of this one op, not copies of it. Merge its values "
          "over micro-batches with epl.add_to_collection(tensor, "
          "epl.GraphKeys.GLOBAL_CONCAT_OBJECTS), or set "
          "pipeline.accumulation to \"copies\" to get one copy per "
          "micro-batch." % _op_of(obj).name)
    local, origin = self._local_replica_of(_op_of(obj))
    copies = []
    for clones in result.copies.micro_batches[1:]:
      clone = clones.get(origin)
      if clone is None or clone.name == origin:
        break
      copies.append(result.copies.op(local, clone))
    return self._like(obj, copies)

  def _like(self, obj, ops):
    """Views of `ops` (copies of `obj`'s op): Operations, or for a Tensor
    the same output of each."""
    if isinstance(obj, Tensor):
      index = obj.primitive_obj.value_index
      return [Tensor(self, op.outputs[index]) for op in ops]
    return [Operation(self, op) for op in ops]

  def __repr__(self):
    return "epl.Graph(%d TaskGraph(s))" % self.num_stages


def _op_of(obj):
  """The tf.Operation of an Operation view, or of a Tensor view's
  producer."""
  return obj.op.primitive_obj if isinstance(obj, Tensor) else (
      obj.primitive_obj)


class _Operations:
  """The graph's ops by name, wrapped on access (a read-only mapping)."""

  def __init__(self, graph):
    self._graph = graph

  def __getitem__(self, name):
    op = self._graph.get_operation_by_name(name)
    if op is None:
      raise KeyError(name)
    return op

  def get(self, name, default=None):
    op = self._graph.get_operation_by_name(name)
    return default if op is None else op

  def __contains__(self, name):
    return self._graph.get_operation_by_name(name) is not None

  def __iter__(self):
    return (op.name for op in self._graph.primitive_obj.get_operations())

  def keys(self):
    return list(self)

  def values(self):
    return [Operation(self._graph, op)
            for op in self._graph.primitive_obj.get_operations()]

  def items(self):
    return [(op.name, op) for op in self.values()]

  def __len__(self):
    return len(self._graph.primitive_obj.get_operations())


class TaskGraph:
  """The view of one TaskGraph: a strategy scope's part of the model."""

  def __init__(self, graph, taskgraph):
    self.graph = graph
    self._taskgraph = taskgraph
    self.operations = _StageOps(self)

  @property
  def index(self):
    return self._taskgraph.index

  @property
  def strategy(self):
    return self._taskgraph.strategy

  @property
  def num_device_per_replica(self):
    return self._taskgraph.device_count or 1

  @property
  def is_first_stage(self):
    return self.index == 0

  @property
  def is_last_stage(self):
    return self.index == self.graph.num_stages - 1

  @property
  def virtual_device(self):
    """This TaskGraph's VirtualDevice: slice r holds its devices in
    replica r (`epl.Env.get().cluster.virtual_devices`)."""
    with self.graph.primitive_obj.as_default():
      virtual_devices = Env.get().cluster.virtual_devices
    return virtual_devices[min(self.index, len(virtual_devices) - 1)]

  @property
  def num_replicas(self):
    """Model replicas of the whole job."""
    return self.virtual_device.num_replicas

  @property
  def local_num_replicas(self):
    """Replicas whose devices of this TaskGraph are on this worker."""
    return max(len(self.virtual_device.local_devices), 1)

  @property
  def pipeline_config(self):
    return self.graph.get_pipeline_config()

  def get_variables(self, replica_idx):
    """The variables of this TaskGraph in local replica `replica_idx`, as
    tensors (each variable op's output), in the order of the graph's global
    variables."""
    tf_graph = self.graph.primitive_obj
    variables = []
    for variable in tf_graph.get_collection(
        tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
      op = variable.op
      if self.graph.taskgraph_of(op) is not self:
        continue
      if replica_idx:
        copies = self.graph.get_local_replicas(op)
        if len(copies) < replica_idx:
          continue
        op = copies[replica_idx - 1].primitive_obj
      variables.append(op.outputs[0])
    return variables

  def __repr__(self):
    return "epl.TaskGraph(index=%d, %r)" % (self.index, self.strategy)


class _StageOps:
  """A TaskGraph's ops by phase, replica and micro-batch."""

  def __init__(self, taskgraph):
    self._taskgraph = taskgraph

  def _select(self, phase, replica_idx, micro_batch_idx):
    graph = self._taskgraph.graph
    return [Operation(graph, op) for op in graph.replica_ops(replica_idx)
            if graph.phase_of(op) == phase and
            graph.taskgraph_of(op) is self._taskgraph and
            (micro_batch_idx is None or
             graph.micro_batch_of(op) == micro_batch_idx)]

  def forward_operations(self, replica_idx, micro_batch_idx):
    return self._select(ModelPhase.FORWARD, replica_idx, micro_batch_idx)

  def backward_operations(self, replica_idx, micro_batch_idx):
    return self._select(ModelPhase.BACKWARD, replica_idx, micro_batch_idx)

  def apply_operations(self, replica_idx):
    return self._select(ModelPhase.APPLY, replica_idx, None)


class _Wrapped:
  """A tf.Operation or tf.Tensor (`primitive_obj`) seen through the view
  of its graph; equal to another view of the same object."""

  def __init__(self, graph, primitive_obj):
    self._graph = graph
    self.primitive_obj = primitive_obj

  @property
  def name(self):
    return self.primitive_obj.name

  @property
  def device(self):
    return self.primitive_obj.device

  def __eq__(self, other):
    return type(other) is type(self) and (
        other.primitive_obj is self.primitive_obj)

  def __hash__(self):
    return hash(id(self.primitive_obj))


class Operation(_Wrapped):
  """The view of one op: the tf.Operation with its TaskGraph and phase
  (`epl.Operation`)."""

  @property
  def type(self):
    return self.primitive_obj.type

  @property
  def node_def(self):
    return self.primitive_obj.node_def

  @property
  def inputs(self):
    return [Tensor(self._graph, t) for t in self.primitive_obj.inputs]

  @property
  def outputs(self):
    return [Tensor(self._graph, t) for t in self.primitive_obj.outputs]

  @property
  def control_inputs(self):
    return [Operation(self._graph, op)
            for op in self.primitive_obj.control_inputs]

  @property
  def taskgraph(self):
    """The TaskGraph view of this op; None for ops outside every one."""
    return self._graph.taskgraph_of(self.primitive_obj)

  @property
  def phase(self):
    """Its ModelPhase: FORWARD, BACKWARD, APPLY, or OTHER for ops outside
    the training step."""
    return self._graph.phase_of(self.primitive_obj)

  @property
  def function(self):
    return None

  def get_attr(self, name):
    return self.primitive_obj.get_attr(name)

  def __str__(self):
    return ("epl.Operation(name='%s', device=%s, type=%s, function=%s, "
            "phase=%s)" % (self.name, self.device, self.type, self.function,
                           self.phase))

  __repr__ = __str__


class Tensor(_Wrapped):
  """The view of one tensor: the tf.Tensor with its producer's TaskGraph."""

  @property
  def dtype(self):
    return self.primitive_obj.dtype

  @property
  def shape(self):
    return self.primitive_obj.shape

  @property
  def op(self):
    return Operation(self._graph, self.primitive_obj.op)

  producer = op

  @property
  def taskgraph(self):
    return self.op.taskgraph

  @property
  def consumers(self):
    return [Operation(self._graph, op)
            for op in self.primitive_obj.consumers()]

  def __str__(self):
    return "Tensor('%s', shape=%s, dtype=%s, device='%s', phase=%s)" % (
        self.name, self.shape, self.dtype.name, self.device, self.op.phase)

  __repr__ = __str__
