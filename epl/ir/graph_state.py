"""What EPL captured about one tf.Graph while the user built it.

The state lives on the graph itself (not in a process-wide table), so a
graph that the user drops is freed with its state, and a later `epl.init`
starts every graph afresh.
"""
import dataclasses
from typing import List, Optional

from epl.env import Env
from epl.ir.phase import Phase
from epl.ir.provenance import Provenance
from epl.ir.taskgraph import TaskGraph

_ATTRIBUTE = "_epl_graph_state"
# The TaskGraph of ops built before the first strategy scope: the first
# TaskGraph, whichever it turns out to be (the original EPL's rule).
_FIRST_TASKGRAPH = object()


@dataclasses.dataclass(frozen=True)
class GradientRecord:
  """One `tf.gradients` (or `GradientTape.gradient`) call.

  `pairs` are its (gradient, variable op) results for the sources that are
  variables, gradients as TensorFlow returned them (Tensors or
  IndexedSlices), before any user post-processing.
  """
  pairs: tuple


@dataclasses.dataclass(frozen=True)
class ApplyRecord:
  """One call of `Optimizer.apply_gradients` of the base class.

  `grads_and_vars` are the pairs the optimizer applied (possibly
  post-processed, e.g. clipped); `train_op` is the op it returned.
  """
  grads_and_vars: tuple
  train_op: object
  global_step: object = None


@dataclasses.dataclass
class SplitRecords:
  """What the lowerings under `epl.split` recorded while the user built the
  graph (epl/parallel/ops/split_lowering.py)."""
  # Tensor name -> ShardedLogits of each split dense output.
  logits: dict = dataclasses.field(default_factory=dict)
  # Tensor name -> ShardedLogits of the logits of each split argmax's
  # (or top_k's) predictions.
  predictions: dict = dataclasses.field(default_factory=dict)
  # Variable op name -> ShardedVariable of each variable built sharded.
  variables: dict = dataclasses.field(default_factory=dict)
  # Tensor name -> TracedShard of each shard a split layer of a traced TF2
  # step took of a user's whole eager weight.
  traced_shards: dict = dataclasses.field(default_factory=dict)
  # Names of the split variables (among `variables`) whose shards the
  # caller of a traced step writes before every run
  # (epl.runtime.traced_shards): the graph has no initializer for them.
  written_by_caller: set = dataclasses.field(default_factory=set)


class GraphState:
  """What capture recorded of one graph: TaskGraphs, op tags, gradient and
  apply records, loss seeds, split lowerings, provenance; and the handle
  to its rewrite."""

  def __init__(self, graph, generation):
    self.graph = graph
    self.generation = generation
    self.taskgraphs: List[TaskGraph] = []
    self._taskgraph_by_name = {}
    self._op_taskgraph = {}
    self._op_phase = {}
    # Micro-batch index of each op of a micro-batch's forward or backward
    # pass (set by the rewrite); None for ops that run once per step.
    self._op_micro_batch = {}
    self.gradient_records: List[GradientRecord] = []
    self.apply_records: List[ApplyRecord] = []
    # Slot variable op name -> the variable op it is a slot of, as each
    # optimizer's `get_slot` answered after `apply_gradients`
    # (epl.ir.variables).
    self.slot_owners = {}
    # Names of the ones-fills `tf.gradients` seeded the backward pass with
    # (the losses' gradients), for the loss scale.
    self.loss_seeds = set()
    self.split = SplitRecords()
    # Where each op EPL built comes from (epl.ir.provenance): recorded at
    # capture (roles, loss seeds' ops) and by the rewrite, one record.
    self.provenance = Provenance()
    # What became of the captured graph: the engine's RewriteResult, set
    # once the rewrite ran. Kept here, not by the engine, because layers
    # below it read it (ir.graph's copies, capture's IO slicing check,
    # the planner's virtual devices). What the passes keep for later is in
    # its artifacts; the plan's and the runtime's caches are their own.
    self.rewrite_result = None

  def taskgraph_for(self, strategy):
    """The TaskGraph of `strategy` in this graph, created on first use."""
    taskgraph = self._taskgraph_by_name.get(strategy.name)
    if taskgraph is None:
      taskgraph = TaskGraph(len(self.taskgraphs), strategy)
      self.taskgraphs.append(taskgraph)
      self._taskgraph_by_name[strategy.name] = taskgraph
    elif type(taskgraph.strategy) is not type(strategy) or (
        taskgraph.strategy.device_count != strategy.device_count):
      raise ValueError(
          "Strategy name %r is used twice with different settings: %r and "
          "%r. Give each strategy scope its own name." %
          (strategy.name, taskgraph.strategy, strategy))
    return taskgraph

  def discard_if_empty(self, strategy):
    """Forgets `strategy`'s TaskGraph when it is the newest and no op was
    tagged with it: a scope whose body raised before building anything
    leaves no stage behind (it would count as a pipeline stage at the next
    scope's entry)."""
    taskgraph = self._taskgraph_by_name.get(strategy.name)
    if (taskgraph is not None and self.taskgraphs[-1] is taskgraph and
        taskgraph not in self._op_taskgraph.values()):
      self.taskgraphs.pop()
      del self._taskgraph_by_name[taskgraph.name]

  def tag(self, op, taskgraph, phase, micro_batch=None):
    self._op_taskgraph[op.name] = taskgraph
    self._op_phase[op.name] = phase
    if micro_batch is not None:
      self._op_micro_batch[op.name] = micro_batch

  def tag_before_first_strategy(self, op):
    """Tags `op`, built before any strategy scope, as forward work of the
    first TaskGraph."""
    self.tag(op, _FIRST_TASKGRAPH, Phase.FORWARD)

  def copy_tags(self, source, target):
    """Gives op `target` (a clone) every tag of op `source`."""
    self.tag(target, self.taskgraph_of(source), self.phase_of(source),
             self.micro_batch_of(source))

  def copy_tags_to_copies(self, names, prefix, micro_batch=None):
    """Gives the copy `<prefix><name>` of each op named in `names` every
    tag of that op: `copy_tags` for a whole copy at once (it runs once
    per op of every replica). With `micro_batch`, every copy is tagged
    with that micro-batch instead of its op's."""
    taskgraphs, phases = self._op_taskgraph, self._op_phase
    micro_batches = self._op_micro_batch
    targets = [prefix + name for name in names]
    taskgraphs.update(zip(targets, map(taskgraphs.get, names)))
    phases.update(zip(targets, [phases.get(name, Phase.OTHER)
                                for name in names]))
    if micro_batch is not None:
      micro_batches.update((target, micro_batch) for target in targets)
    else:
      micro_batches.update((target, micro_batches[name])
                           for target, name in zip(targets, names)
                           if name in micro_batches)

  def taskgraph_of(self, op) -> Optional[TaskGraph]:
    taskgraph = self._op_taskgraph.get(op.name)
    if taskgraph is _FIRST_TASKGRAPH:
      return self.taskgraphs[0] if self.taskgraphs else None
    return taskgraph

  def taskgraph_index(self, op):
    """The index of `op`'s TaskGraph; 0 when it has none."""
    taskgraph = self.taskgraph_of(op)
    return taskgraph.index if taskgraph is not None else 0

  def phase_of(self, op) -> Phase:
    return self._op_phase.get(op.name, Phase.OTHER)

  def set_phase(self, op, phase):
    self._op_phase[op.name] = phase

  def set_taskgraph(self, op, taskgraph):
    self._op_taskgraph[op.name] = taskgraph

  def micro_batch_of(self, op) -> Optional[int]:
    return self._op_micro_batch.get(op.name)

  def set_micro_batch(self, op, micro_batch):
    self._op_micro_batch[op.name] = micro_batch

  def micro_batch_tags(self):
    """{op name: micro-batch index} of the ops of a micro-batch (read
    only: for recording a whole copy at once)."""
    return self._op_micro_batch


def state_of(graph, create=False):
  """The GraphState of `graph` under the current environment.

  None when EPL is not initialised, or when the graph has none and not
  `create`. A state left by an earlier `epl.init` counts as none, unless
  the graph was rewritten under it: a rewritten graph keeps the plan,
  config and cluster it was rewritten with (`rewrite_result.context`), so
  that its steps run as they did before the later `epl.init` (its fetches
  merged, its feeds split), whichever config is current.
  """
  if not Env.initialised():
    return None
  generation = Env.get().generation
  state = getattr(graph, _ATTRIBUTE, None)
  if state is not None and (state.generation == generation or
                            state.rewrite_result is not None):
    return state
  if not create:
    return None
  state = GraphState(graph, generation)
  setattr(graph, _ATTRIBUTE, state)
  return state


def unrewritten_earlier_state(graph):
  """The state an earlier `epl.init` left on `graph` with a training step
  it never rewrote (None if there is none): the config it was built under
  is gone, so it can no longer be rewritten as its user meant."""
  state = getattr(graph, _ATTRIBUTE, None)
  if (state is None or not Env.initialised() or
      state.generation == Env.get().generation or
      state.rewrite_result is not None or not state.gradient_records):
    return None
  return state
