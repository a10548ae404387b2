"""The pipeline schedule: in which order each stage runs the forward and
backward passes of the micro-batches, enforced with control edges."""
import collections
import dataclasses
from typing import Optional

import tensorflow as tf

from epl.ir import control_flow
from epl.ir import graph_editor
from epl.ir import names as epl_names
from epl.ir.phase import Phase
from epl.parallel.plan import pipeline_order



@dataclasses.dataclass(frozen=True)
class Block:
  """The ops one stage of one replica runs for one micro-batch and phase
  (FORWARD or BACKWARD; APPLY with micro_batch None for the update).

  Under a schedule that splits the backward (ZB-H1, ZB-V), a BACKWARD
  block is either the input-gradient part B (`weight_gradients` False)
  or the weight-gradient part W (True); see `split_backward`.
  """
  replica: int
  stage: int
  phase: Phase
  micro_batch: Optional[int]
  weight_gradients: bool = False

  @property
  def kind(self):
    """The pass it is, as `pipeline_order` names them ("forward",
    "backward", "weight"; "apply" for the update)."""
    if self.weight_gradients:
      return pipeline_order.WEIGHT
    return self.phase.value

  @classmethod
  def of_pass(cls, replica, stage, kind, micro_batch):
    """The block of pass `kind` (a `pipeline_order` kind) of `stage` for
    `micro_batch`."""
    if kind == pipeline_order.FORWARD:
      return cls(replica, stage, Phase.FORWARD, micro_batch)
    return cls(replica, stage, Phase.BACKWARD, micro_batch,
               kind == pipeline_order.WEIGHT)


def _replica_0_blocks(ctx, subgraph):
  """{(stage, phase, micro-batch): [ops]} of replica 0, in the cloned
  subgraph's order (see `blocks`)."""
  by_key = collections.defaultdict(list)
  updates = set()
  for op in subgraph.cloned:
    phase = ctx.state.phase_of(op)
    micro_batch = ctx.state.micro_batch_of(op)
    if phase is Phase.APPLY:
      if not any(i.name in updates or
                 ctx.state.phase_of(i) is Phase.BACKWARD
                 for i in graph_editor.input_ops(op)):
        continue
      updates.add(op.name)
      micro_batch = None
    elif micro_batch is None or phase not in (Phase.FORWARD, Phase.BACKWARD):
      continue
    by_key[(ctx.taskgraph_index(op), phase, micro_batch)].append(op)
  return by_key


def _input_gradients(by_key, through_gates):
  """{backward key: names of its B ops}: the ops whose outputs a backward
  op of another stage reads, and the ops of the block they depend on
  through data edges and control edges; with `through_gates` False, not
  through a control input that is a NoOp (a gate of tf.gradients, which
  orders and computes nothing)."""
  key_of = {op.name: key for key, ops in by_key.items() for op in ops}

  def read_by_another_stage(op, stage):
    return any(key_of.get(c.name, (stage,))[0] != stage and
               key_of[c.name][1] is Phase.BACKWARD
               for t in op.outputs for c in t.consumers())

  result = {}
  for key, ops in by_key.items():
    if key[1] is not Phase.BACKWARD:
      continue
    names = {op.name for op in ops}

    def inputs(op, names=names):
      return [t.op for t in op.inputs if t.op.name in names] + [
          c for c in op.control_inputs if c.name in names and
          (through_gates or c.type != "NoOp")]
    result[key] = {op.name for op in graph_editor.reachable(
        [op for op in ops if read_by_another_stage(op, key[0])], inputs)}
  return result


def ungate_input_gradients(ctx, subgraph, copies):
  """Lets each stage's input gradients (B) run before its weight
  gradients (W), in every local replica.

  tf.gradients gates the gradients of an op (the default
  gate_gradients=GATE_OP): a NoOp waits for all of them and each output
  Identity waits for the NoOp, so the input gradient a MatMul sends to the
  previous stage would wait for its kernel gradient. A B op's control
  input on such a NoOp that is not itself needed by B is replaced by
  control inputs on the NoOp's inputs that are in B: the gate still orders
  B's ops, and stops waiting for W. Values do not change.
  """
  by_key = _replica_0_blocks(ctx, subgraph)
  for key, needed in _input_gradients(by_key, through_gates=False).items():
    names = {op.name for op in by_key[key]}
    for op in by_key[key]:
      if op.name not in needed:
        continue
      for gate in op.control_inputs:
        if (gate.type != "NoOp" or gate.name in needed or
            gate.name not in names):
          continue
        kept = [i for i in graph_editor.input_ops(gate) if i.name in needed]
        for local in range(len(ctx.replicas)):
          copy = copies.op(local, op)
          graph_editor.remove_control_input(copy, copies.op(local, gate))
          graph_editor.add_control_inputs(
              copy, [copies.op(local, i) for i in kept])


def ungate_across_stages(ctx, subgraph, copies):
  """Stops a backward op of one stage from waiting on a gate of another
  stage's backward, in every local replica.

  tf.gradients gates an op's gradients (gate_gradients=GATE_OP): each
  output Identity waits for a NoOp that waits for all of them. When the
  Identity is colocated with an op of the next stage (the gradient
  arriving from it, summed there: BERT's residual connections between
  layers of two stages), it belongs to that stage while its gate belongs
  to this one, so the later stage's backward of a micro-batch would wait
  for the earlier stage's backward of it. 1F1B only delays the later
  stage; interleaved 1F1B, which runs a later stage's backward on a device
  before an earlier one's, would wait in a cycle. Such a control input is
  replaced by control inputs on the gate's inputs of the op's own block
  (none, mostly): the gate still orders what the stage computes, and
  values do not change (a gate computes nothing).
  """
  by_key = _replica_0_blocks(ctx, subgraph)
  key_of = {op.name: key for key, ops in by_key.items() for op in ops}
  for key, ops in by_key.items():
    if key[1] is not Phase.BACKWARD:
      continue
    for op in ops:
      for gate in op.control_inputs:
        gate_key = key_of.get(gate.name)
        if (gate.type != "NoOp" or gate_key is None or
            gate_key[1] is not Phase.BACKWARD or gate_key[0] == key[0]):
          continue
        kept = [i for i in graph_editor.input_ops(gate)
                if key_of.get(i.name) == key]
        for local in range(len(ctx.replicas)):
          copy = copies.op(local, op)
          graph_editor.remove_control_input(copy, copies.op(local, gate))
          graph_editor.add_control_inputs(
              copy, [copies.op(local, i) for i in kept])


def split_backward(by_key):
  """Splits each backward block of {(stage, phase, micro-batch): [ops]}
  into its input-gradient part B and its weight-gradient part W; returns
  {(stage, phase, micro-batch, weight_gradients): [ops]}.

  B is what another stage's backward waits for: the ops whose outputs a
  backward op of another stage reads (the gradients with respect to the
  stage's inputs, sent to the previous stage), and every op of the block
  they depend on, through data or control edges (after
  `ungate_input_gradients`, no gate makes them wait for W). An op that
  serves both (the gradient arriving from the next stage, a recomputed
  activation that both parts read) is in B. W is the rest: the ops that
  lead only to the stage's weight gradients (a MatMul's kernel gradient,
  BiasAddGrad, the accumulation over micro-batches). The first stage sends
  no gradient: its whole backward is W. Forward and apply blocks are kept
  whole.
  """
  needed = _input_gradients(by_key, through_gates=True)
  result = {}
  for key, ops in by_key.items():
    if key not in needed:
      result[key + (False,)] = ops
      continue
    result[key + (False,)] = [op for op in ops if op.name in needed[key]]
    result[key + (True,)] = [op for op in ops
                             if op.name not in needed[key]]
  return result


def share_with_readers(split, device_of):
  """Moves the ops of a B block that the W of a later stage on the same
  device reads, and what they need of their block, into that stage's B
  ({(stage, phase, micro-batch, weight_gradients): [ops]}, changed in
  place); `device_of(stage)` is a stage's pipeline device.

  Under ZB-V stages p - 1 and p share a device (the tip of the V), which
  runs W(p) before B(p - 1). A value of stage p - 1 that W(p) reads (its
  activation recomputed by gradient checkpointing) would have W(p) wait
  for a block that runs after it: in B(p), which runs before W(p) and
  whose gradients its recomputation waits for anyway, it is ready in
  time. The op keeps its stage's device; values do not change.
  """
  for stage, phase, micro_batch, weight in list(split):
    if phase is not Phase.BACKWARD or weight:
      continue
    ops = split[(stage, phase, micro_batch, weight)]
    names = {op.name: op for op in ops}
    for reader in range(stage + 1, 1 + max(key[0] for key in split)):
      if device_of(reader) != device_of(stage):
        continue
      read = [names[t.op.name] for op in split.get(
          (reader, phase, micro_batch, True), ())
              for t in op.inputs if t.op.name in names]
      moved = {op.name for op in graph_editor.reachable(read, lambda op: [
          t.op for t in op.inputs if t.op.name in names])}
      if moved:
        split[(reader, phase, micro_batch, False)] = split.get(
            (reader, phase, micro_batch, False), []) + [
                names[name] for name in names if name in moved]
        ops = [op for op in ops if op.name not in moved]
        names = {op.name: op for op in ops}
        split[(stage, phase, micro_batch, weight)] = ops


def blocks(ctx, subgraph, copies, first_replica_only=False):
  """{Block: [ops]} over every local replica (or the first), in the cloned
  subgraph's order.

  Forward and backward ops of a micro-batch (tagged by the micro-batch
  pass) make its FORWARD and BACKWARD blocks; the optimizer's ops that
  work on gradients (the update, not the reads of its constants) make an
  APPLY block per replica and stage. When pipeline.strategy splits the
  backward (ZB-H1, ZB-V), each BACKWARD block is two, B and W
  (`split_backward`). The blocks are found in replica 0 and mapped to the
  others, copies with the same edges.
  """
  by_key = _replica_0_blocks(ctx, subgraph)
  if ctx.plan.schedule.splits_backward:
    split = split_backward(by_key)
    share_with_readers(split, lambda stage: ctx.plan.device(0, stage))
  else:
    split = {key + (False,): ops for key, ops in by_key.items()}
  replicas = ctx.replicas[:1] if first_replica_only else ctx.replicas
  result = {}
  for local, replica in enumerate(replicas):
    for (stage, phase, micro_batch, weight), ops in split.items():
      if ops:
        result[Block(replica, stage, phase, micro_batch, weight)] = [
            copies.op(local, op) for op in ops]
  return result


def _ends(ops):
  """(first ops, last ops) of `ops`: those with no input, and those with no
  consumer, among `ops`, leaving out ops that TF1 control flow may skip or
  repeat (control_flow.conditional_op_names): their loop or cond runs
  between the ends found around it."""
  conditional = control_flow.conditional_op_names(ops)
  ops = [op for op in ops if op.name not in conditional]
  names = {op.name for op in ops}
  first = [op for op in ops
           if not any(i.name in names for i in graph_editor.input_ops(op))]
  last = [op for op in ops
          if not any(c.name in names for t in op.outputs
                     for c in t.consumers()) and
          not any(c.name in names for c in graph_editor.control_outputs(op))]
  return first, last


def _block_ends(copies, by_block):
  """ends(local, block): the first and last ops of `block` in local replica
  `local`, found once in the first replica and mapped."""
  first_replica_ends = {}

  def ends(local, block):
    if block not in first_replica_ends:
      first_replica_ends[block] = _ends(by_block[block])
    return tuple([copies.op(local, op) for op in ops]
                 for ops in first_replica_ends[block])
  return ends


def _chain_blocks(ctx, orders, stages, by_block, ends):
  """On each device of each local replica, a NoOp after each block that
  the next block in `orders` waits for."""
  with ctx.building(""):
    for local, replica in enumerate(ctx.replicas):
      for order in orders:
        previous = None
        for kind, stage_index, micro_batch in order:
          stage = stages[stage_index]
          block = Block.of_pass(ctx.replicas[0], stage, kind, micro_batch)
          if block not in by_block:
            continue
          first, last = ends(local, block)
          if previous is not None:
            for op in first:
              graph_editor.add_control_inputs(op, [previous])
          with tf.device(ctx.device(local, stage)), \
              tf.control_dependencies(last):
            previous = tf.no_op(name=epl_names.in_replica(
                epl_names.SCHEDULE, replica, "stage_%d" % stage,
                "after_%s_%d" % (kind, micro_batch)))


def schedule_pipeline(ctx, subgraph, copies):
  """Makes every pipeline device of every replica run its blocks in
  schedule order.

  For each device of each local replica, the blocks (forward or backward
  pass of one micro-batch of a stage; under ZB-H1 and ZB-V the backward's B
  and W parts) follow `pipeline_order.device_orders` for
  pipeline.strategy: one stage per device (`stage_order`), or with
  pipeline.virtual_stages v > 1 the v stages a device holds under
  interleaved 1F1B (`interleaved_device_order`) or the two of ZB-V
  (`v_device_order`). A NoOp
  `EPL_SCHEDULE/...` on the device waits for the last ops of a block, and
  the first ops of the next block wait for the NoOp, so that no op of a
  block starts before the previous block has finished. Only control edges
  change (tf.gradients' gates across stages are lifted first,
  `ungate_across_stages`); with one micro-batch nothing changes (a stage's
  backward already follows its forward), nor with split TaskGraphs (they
  share the data-parallel part's devices: no stages), nor when the
  micro-batches run as a loop (its iterations run one after another).
  """
  plan = ctx.plan
  if plan.num_micro_batch == 1 or plan.has_split or (
      copies.loop_values is not None):
    return
  ungate_across_stages(ctx, subgraph, copies)
  if plan.schedule.splits_backward:
    ungate_input_gradients(ctx, subgraph, copies)
  # Replicas are copies with the same edges inside each block: the blocks
  # and their ends are found in the first replica and mapped to the others.
  by_block = blocks(ctx, subgraph, copies, first_replica_only=True)
  if plan.virtual_stages == 1:
    stages = sorted({block.stage for block in by_block})
  else:
    # Stage s's device is fixed by its index among all the stages.
    stages = list(range(plan.num_stages))
  orders = pipeline_order.device_orders(
      plan.schedule, len(stages), plan.num_micro_batch, plan.virtual_stages)
  _chain_blocks(ctx, orders, stages, by_block,
                _block_ends(copies, by_block))
