"""Auto parallel (`auto.auto_parallel`): EPL chooses the stages itself.

The user's script has no strategy annotation. At the first `tf.gradients`
(or `GradientTape.gradient`) of a graph, when the forward pass is built and
its backward is not yet, the forward ops are put into S = K x v
TaskGraphs `auto_stage_0` ... (`epl.replicate(1)` each), K
`pipeline.num_stages` and v `pipeline.virtual_stages`; one TaskGraph when
K is 1 or -1: data parallel over every device. The backward ops
`tf.gradients` then builds follow their forward ops, and the rest of EPL
(plan, micro-batches, schedule, gradient aggregation) runs as if the user
had written the S scopes: K devices per model replica (with v > 1 each
holds v stages, s, s + K, ..., under interleaved 1F1B), devices / K
replicas.

How the forward pass is cut:

1. The forward ops (what the gradients' targets depend on) are taken in
   creation order, which is a topological order. Ops that only hold or
   hand on state (constants, variables and their reads, placeholders, the
   input pipeline) are not cut: each goes to the first stage that uses it,
   so a variable lives with the stage of its consumers.
2. Each op costs its FLOPs (`epl.parallel.cost.flops`) plus its output bytes /
   8: FLOPs dominate matrix products, the bytes term gives memory-bound
   ops (element-wise, normalisation, softmax) and zero-FLOP ops (gathers,
   transposes) some weight.
3. A cut falls between two ops of that order. Repeated blocks (name scopes
   with the same op-type counts, such as transformer layers `layer_0`,
   `layer_1`, ...; `epl.parallel.cost.checkpoint_search.repeated_blocks`) are
   never cut inside when the best balance with cuts at block boundaries
   only is within BLOCK_SLACK of the best balance at any point.
4. Balance: the most expensive stage (the bottleneck) costs within
   BALANCE_SLACK of the least it can; the cheapest stage at most
   BALANCE_SLACK times the bottleneck less than the most it can under that
   cap (no near-empty stage when several cuts share one bottleneck).
5. Among the balanced cuts, the cleanest are taken: fewest bytes of
   activations crossing the cut (every later op depends on earlier ones
   through few tensors), then the shallowest name-scope boundary (between
   layers rather than inside one).

Ops built with no scope after the cut (an optimizer's own variables,
gradient clipping, summaries) belong to the last stage, as in a
hand-written pipeline whose last stage is the default strategy; the
gradient processing among them becomes backward work as usual.

The choice is logged at INFO, one line per stage (ops, parameters, FLOPs,
activation bytes), and kept for inspection: `stages_of(graph)`.
"""
import bisect
import collections
import dataclasses
import logging
import weakref
from typing import List

from epl import config as epl_config
from epl.parallel.cost import checkpoint_search
from epl.parallel.cost import flops
from epl.ir import graph_editor
from epl.ir.graph_state import state_of
from epl.ir.op_types import (INPUT_READ_TYPES, PLACEHOLDER_TYPES,
                             VARIABLE_READ_TYPES, VARIABLE_TYPES)
from epl.ir.phase import Phase
from epl.strategies.strategy import Replicate
from epl.tf_compat import graph_edit

logger = logging.getLogger("epl")

STAGE_NAME = "auto_stage_%d"
# Cuts at block boundaries win when their most expensive stage costs at
# most this much more than the best cut anywhere.
BLOCK_SLACK = 0.2
# Cuts are chosen for cleanness among those whose most expensive stage is
# within this of the least possible, and whose cheapest is less than the
# most possible by at most this times the most expensive.
BALANCE_SLACK = 0.05
# FLOPs one output byte counts as in an op's cost.
FLOPS_PER_BYTE = 1.0 / 8
# Weight of the name-scope depth of a boundary against the crossing bytes
# (both normalised to [0, 1]) when choosing among balanced cuts.
SCOPE_WEIGHT = 0.5

# GraphState -> AutoStages of the graphs auto parallel has cut.
_choices = weakref.WeakKeyDictionary()


@dataclasses.dataclass
class Stage:
  """One stage auto parallel made: its TaskGraph index, the forward ops
  given to it (names, in creation order), their cost and parameters."""
  index: int
  ops: List[str]
  cost: flops.Cost
  parameters: int

  def describe(self):
    span = "%s .. %s" % (self.ops[0], self.ops[-1]) if self.ops else "-"
    return ("stage %d %r: %d ops (%s), %d parameters (%s), %s FLOPs, "
            "activations %s" % (
                self.index, STAGE_NAME % self.index, self.cost.ops, span,
                self.parameters, flops.human_bytes(self.cost.parameter_bytes),
                flops.human_count(self.cost.flops),
                flops.human_bytes(self.cost.activation_bytes)))


@dataclasses.dataclass
class AutoStages:
  """What auto parallel chose for one graph."""
  stages: List[Stage]
  # How the cut was chosen: "data parallel", "block boundaries" or
  # "clean points".
  method: str
  blocks: List[str]     # the repeated blocks' name scopes
  cuts: List[str]       # the first op of each stage after the first

  @property
  def flops_ratio(self):
    """Most over fewest FLOPs of a stage (inf when a stage has none)."""
    values = [s.cost.flops for s in self.stages]
    return max(values) / min(values) if min(values) else float("inf")


def stages_of(graph):
  """The AutoStages auto parallel chose for `graph`, or None."""
  state = state_of(graph)
  return _choices.get(state) if state is not None else None


def strategy_after_cut(state):
  """The strategy of ops built with no scope once `state`'s graph is cut:
  the last stage's (as a hand-written pipeline whose last stage is the
  default strategy), so that an optimizer's own variables (a Keras
  optimizer's step count) and later ops have a stage; None before."""
  return state.taskgraphs[-1].strategy if state in _choices else None


def before_gradients(env, targets):
  """Cuts the forward pass of `targets`' graph into stages, once per graph,
  before the first gradients of it are built (a no-op unless
  auto.auto_parallel). Tags every op built so far with its stage's
  TaskGraph; changes no op."""
  if not env.config.auto.auto_parallel or not targets:
    return
  graph = targets[0].graph
  if getattr(graph, "building_function", False):
    return
  state = state_of(graph, create=True)
  if state in _choices:
    return
  if state.taskgraphs:
    raise ValueError(
        "auto.auto_parallel is on but the model set its own strategy (%s, "
        "from epl.set_default_strategy): remove it, or set "
        "auto.auto_parallel to False to annotate the model by hand." %
        ", ".join(repr(t.strategy) for t in state.taskgraphs))
  devices_per_replica = max(env.config.pipeline.num_stages, 1)
  _check_devices(env.cluster.total_devices, devices_per_replica)
  per_device = epl_config.stages_per_device(env.config)
  if devices_per_replica == 1 and per_device > 1:
    raise ValueError(
        "auto.auto_parallel with %d stages per device (pipeline."
        "virtual_stages %d, pipeline.strategy %r) needs pipeline.num_stages "
        "> 1 (the devices of a pipeline); it is %d. Set "
        "pipeline.num_stages, or pipeline.virtual_stages to 1 and a "
        "schedule with one stage per device for data parallelism." % (
            per_device, env.config.pipeline.virtual_stages,
            env.config.pipeline.strategy, env.config.pipeline.num_stages))
  num_stages = cut_stages(env.config)
  untagged = [op for op in graph.get_operations()
              if state.phase_of(op) is Phase.FORWARD and
              state.taskgraph_of(op) is None]
  forward = [op for op in graph_editor.ancestors([t.op for t in targets])
             if state.phase_of(op) is Phase.FORWARD and
             state.taskgraph_of(op) is None]
  forward.sort(key=graph_edit.creation_index)
  if num_stages == 1:
    choice = AutoStages(
        [_stage(0, forward)], "data parallel", [], [])
    stage_of = {}
  else:
    choice, stage_of = _cut(forward, num_stages)
  taskgraphs = [state.taskgraph_for(Replicate(1, STAGE_NAME % s))
                for s in range(num_stages)]
  for op, stage in _stages_of_all(untagged, stage_of).items():
    state.tag(op, taskgraphs[stage], Phase.FORWARD)
  _choices[state] = choice
  _log(choice, env.cluster.total_devices // devices_per_replica,
       devices_per_replica)


def cut_stages(config):
  """The stages auto parallel cuts: pipeline.num_stages (K devices per
  replica, 1 when it is -1) times the stages per device
  (pipeline.virtual_stages v; 2 under ZB-V)."""
  return max(config.pipeline.num_stages, 1) * epl_config.stages_per_device(
      config)


def _check_devices(total, num_stages):
  if num_stages > total or total % num_stages:
    raise ValueError(
        "auto.auto_parallel with pipeline.num_stages=%d needs a device count "
        "that is a multiple of %d, but the cluster has %d device(s). Change "
        "pipeline.num_stages or the devices (cluster.num_cpu_devices on "
        "CPU)." % (num_stages, num_stages, total))


def _is_free(op):
  """Ops that hold or hand on state rather than compute: not cut, they go
  with their first consumer."""
  if not op.inputs:
    return True
  if op.type in VARIABLE_TYPES or op.type in PLACEHOLDER_TYPES or (
      op.type in INPUT_READ_TYPES):
    return True
  return op.type in VARIABLE_READ_TYPES and (
      op.inputs[0].op.type in VARIABLE_TYPES)


def _stage(index, ops):
  parameters = sum(flops.variable_elements(op) for op in ops
                   if op.type in VARIABLE_TYPES)
  return Stage(index, [op.name for op in ops], flops.summarize(ops),
               parameters)


def _stages_of_all(ops, stage_of):
  """{op: stage} for every op of `ops` (creation order): the cut's choice
  where it made one; others read what they compute from (the latest stage
  among their inputs), else go to the first stage that uses them, else to
  the first stage."""
  names = {op.name for op in ops}
  result = {}
  by_name = {}
  for op in ops:
    by_name[op.name] = op
    if op.name in stage_of:
      result[op.name] = stage_of[op.name]
      continue
    found = [result[i.name] for i in graph_editor.input_ops(op)
             if i.name in result]
    if found:
      result[op.name] = max(found)
  for op in reversed(ops):
    if op.name not in result:
      found = [result[c.name] for c in graph_editor.output_ops(op)
               if c.name in names and c.name in result]
      result[op.name] = min(found) if found else 0
  return {by_name[name]: stage for name, stage in result.items()}


def _cut(forward, num_stages):
  """(AutoStages, {op name: stage}) for `forward` (creation order)."""
  compute = [op for op in forward if not _is_free(op)]
  if len(compute) < num_stages:
    raise ValueError(
        "auto.auto_parallel cannot cut a forward pass of %d computing op(s) "
        "into pipeline.num_stages=%d stages; use fewer stages." %
        (len(compute), num_stages))
  costs = [flops.op_flops(op) + FLOPS_PER_BYTE * flops.activation_bytes(op)
           for op in compute]
  prefix = [0.0]
  for cost in costs:
    prefix.append(prefix[-1] + cost)
  weights = _cut_weights(compute)
  blocks = checkpoint_search.repeated_blocks(forward)
  inside = _inside_blocks(compute, blocks)
  positions = list(range(1, len(compute)))
  outside = [p for p in positions if not inside[p]]
  best_anywhere = _min_max_cost(prefix, positions, num_stages)
  method = "clean points"
  allowed, best = positions, best_anywhere
  if blocks and len(outside) >= num_stages - 1:
    best_outside = _min_max_cost(prefix, outside, num_stages)
    if best_outside <= (1 + BLOCK_SLACK) * best_anywhere:
      method, allowed, best = "block boundaries", outside, best_outside
  cap = best * (1 + BALANCE_SLACK)
  floor = max(_max_min_cost(prefix, allowed, num_stages, cap) -
              BALANCE_SLACK * cap, 0.0)
  cuts = _cleanest_cuts(prefix, allowed, weights, num_stages, cap, floor)
  bounds = [0] + cuts + [len(compute)]
  stage_of = {}
  for stage in range(num_stages):
    for op in compute[bounds[stage]:bounds[stage + 1]]:
      stage_of[op.name] = stage
  everything = _stages_of_all(forward, stage_of)
  by_stage = collections.defaultdict(list)
  for op in forward:
    by_stage[everything[op]].append(op)
  choice = AutoStages(
      [_stage(s, by_stage[s]) for s in range(num_stages)], method,
      sorted({_block_scope(b) for b in blocks}),
      [compute[c].name for c in cuts])
  return choice, {op.name: s for op, s in everything.items()}


def _block_scope(ops):
  """The name scope all of a block's ops share."""
  parts = [op.name.split("/")[:-1] for op in ops]
  common = []
  for level in zip(*parts):
    if len(set(level)) > 1:
      break
    common.append(level[0])
  return "/".join(common)


def _inside_blocks(compute, blocks):
  """inside[p]: a cut before compute[p] would split a repeated block."""
  index = {op.name: i for i, op in enumerate(compute)}
  inside = [False] * (len(compute) + 1)
  for block in blocks:
    members = [index[op.name] for op in block if op.name in index]
    if members:
      for p in range(min(members) + 1, max(members) + 1):
        inside[p] = True
  return inside


def _cut_weights(compute):
  """weights[p] of a cut before compute[p]: the bytes of activations that
  ops before it hand to ops after it (normalised) plus SCOPE_WEIGHT times
  how deep in the name scopes the two ops around it share (normalised)."""
  count = len(compute)
  index = {op.name: i for i, op in enumerate(compute)}
  crossing = [0] * (count + 1)
  for i, op in enumerate(compute):
    for tensor in op.outputs:
      last = max((index[c.name] for c in tensor.consumers()
                  if c.name in index), default=i)
      if last > i:
        size = flops.tensor_bytes(tensor)
        crossing[i + 1] += size
        crossing[last + 1] -= size
  running = 0
  for p in range(count + 1):
    running += crossing[p]
    crossing[p] = running
  depth = [0] * (count + 1)
  for p in range(1, count):
    before = compute[p - 1].name.split("/")[:-1]
    after = compute[p].name.split("/")[:-1]
    shared = 0
    while shared < min(len(before), len(after)) and (
        before[shared] == after[shared]):
      shared += 1
    depth[p] = shared
  top_bytes = max(crossing) or 1
  top_depth = max(depth) or 1
  return [crossing[p] / top_bytes + SCOPE_WEIGHT * depth[p] / top_depth
          for p in range(count + 1)]


def _points(prefix, allowed):
  """The possible stage ends (0, the allowed cuts, the end) and the cost
  of the ops before each."""
  points = [0] + list(allowed) + [len(prefix) - 1]
  return points, [prefix[p] for p in points]


def _windows(values, cap, floor):
  """For each point j, the range [lo, hi] of points i < j after which a
  stage ending at j costs between `floor` and `cap` (empty when hi < lo)."""
  lo = [bisect.bisect_left(values, v - cap) for v in values]
  hi = [min(bisect.bisect_right(values, v - floor), j) - 1
        for j, v in enumerate(values)]
  return lo, hi


def _feasible(values, num_stages, cap, floor):
  """Whether num_stages stages ending at the points can each cost between
  `floor` and `cap`."""
  lo, hi = _windows(values, cap, floor)
  reach = [True] + [False] * (len(values) - 1)
  for _ in range(num_stages):
    counts = [0]
    for reached in reach:
      counts.append(counts[-1] + reached)
    reach = [hi[j] >= lo[j] and counts[hi[j] + 1] > counts[lo[j]]
             for j in range(len(values))]
  return reach[-1]


def _bisect_cost(low, high, feasible):
  """The boundary between infeasible and feasible costs in [low, high]
  (`feasible` monotone), to a relative 1e-9."""
  for _ in range(100):
    if high - low <= 1e-9 * max(abs(high), 1.0):
      break
    middle = (low + high) / 2
    if feasible(middle):
      high = middle
    else:
      low = middle
  return high


def _min_max_cost(prefix, allowed, num_stages):
  """The least cost of the most expensive stage over the cuts at
  positions of `allowed` (sorted)."""
  _, values = _points(prefix, allowed)
  return _bisect_cost(0.0, values[-1], lambda cap: _feasible(
      values, num_stages, cap, 0.0))


def _max_min_cost(prefix, allowed, num_stages, cap):
  """The greatest cost of the cheapest stage over the cuts at positions
  of `allowed` whose stages each cost at most `cap`."""
  _, values = _points(prefix, allowed)
  return -_bisect_cost(-cap, 0.0, lambda floor: _feasible(
      values, num_stages, cap, -floor))


def _cleanest_cuts(prefix, allowed, weights, num_stages, cap, floor=0.0):
  """The num_stages - 1 positions of `allowed` with the least total weight
  whose stages each cost between `floor` and `cap` (dynamic programming
  over the points, a sliding-window minimum per stage)."""
  points, values = _points(prefix, allowed)
  lo, hi = _windows(values, cap, floor)
  last = len(points) - 1
  inf = float("inf")
  best = [0.0] + [inf] * last
  parents = []
  for _ in range(num_stages):
    current = [inf] * len(points)
    parent = [-1] * len(points)
    window = collections.deque()
    pushed = 0
    for j in range(1, len(points)):
      while pushed <= hi[j]:
        while window and best[window[-1]] >= best[pushed]:
          window.pop()
        window.append(pushed)
        pushed += 1
      while window and window[0] < lo[j]:
        window.popleft()
      if window and best[window[0]] < inf:
        current[j] = best[window[0]] + (weights[points[j]] if j < last
                                        else 0.0)
        parent[j] = window[0]
    parents.append(parent)
    best = current
  if best[last] == inf:
    raise ValueError("auto.auto_parallel found no cut into %d stages" %
                     num_stages)
  cuts = []
  j = last
  for parent in reversed(parents):
    j = parent[j]
    cuts.append(points[j])
  return sorted(cuts)[1:]


def _log(choice, replicas, devices_per_replica):
  if len(choice.stages) == 1:
    logger.info("Auto parallel: data parallel, %d replica(s) of the whole "
                "model", replicas)
  else:
    logger.info(
        "Auto parallel: %d stages on %d device(s) x %d replica(s), cut at "
        "%s%s; most/fewest stage FLOPs %.2f", len(choice.stages),
        devices_per_replica, replicas, choice.method,
        " (%d repeated blocks: %s)" % (len(choice.blocks), ", ".join(
            choice.blocks[:3] + ["..."] * (len(choice.blocks) > 3)))
        if choice.blocks else "", choice.flops_ratio)
  for stage in choice.stages:
    logger.info("Auto parallel: %s", stage.describe())
