"""offload.level v0: the model's state lives in host memory.

Every replica's variables (weights, optimizer slots, the optimizer's own
values) and the optimizer's update ops are placed on the CPU of the worker
that holds them; save and restore follow (TensorFlow runs the ops that
read or write a variable where the variable is). The forward and backward
passes still run on the accelerator: each op there that reads a variable
gets its own read, which waits (control edges) for the op's other inputs,
so the copy to the device is made just before it is used and freed after,
not kept alive from the forward pass to the backward pass.
"""
import logging

from epl.ir import graph_editor
from epl.ir import names as epl_names
from epl.ir.op_types import VARIABLE_READ_TYPES, VARIABLE_TYPES
from epl.ir.phase import Phase
from epl.parallel.passes.variable_sync import read_value

logger = logging.getLogger("epl")


def _host(ctx, local, op):
  """The CPU of the worker that holds `op`'s TaskGraph in local replica
  `local` (a pipeline's stages may sit on several workers)."""
  workers = ctx.plan.device_workers[ctx.replicas[local]]
  return ctx.cluster.host_device(
      workers[min(ctx.taskgraph_index(op), len(workers) - 1)])


def _variable_read(op, variables):
  """The variable op `op` reads, if it is a plain read of one of them."""
  if (op.type in VARIABLE_READ_TYPES and op.inputs and
      op.inputs[0].op.name in variables):
    return op.inputs[0].op
  return None


def _read_just_in_time(ctx, consumer, reads):
  """`consumer` reads each variable of `reads` ({input index: variable op})
  through a read of its own, made after its other inputs are ready."""
  others = [t.op for i, t in enumerate(consumer.inputs) if i not in reads]
  for index, variable in sorted(reads.items()):
    with ctx.graph.control_dependencies(others or None):
      fresh = read_value(variable)
    graph_editor.update_input(consumer, index, fresh)


def offload_variables(ctx, copies):
  """Places every replica's variables and updates on its worker's CPU.

  Variable ops and APPLY ops of each local replica (ZeRO's updates with
  their owner) go to the host; each FORWARD or BACKWARD op that reads a
  variable reads it through a new read on the host that waits for the
  op's other inputs. Keeps every other op's device, and every name. Runs
  when offload.level is "v0".
  """
  moved = reads = 0
  with ctx.building(epl_names.OFFLOAD), \
      ctx.graph.colocate_with(None, ignore_existing=True):
    for local in range(len(ctx.replicas)):
      ops = list(copies.clones[local].values())
      variables = {}
      for op in ops:
        if op.type in VARIABLE_TYPES:
          variables[op.name] = op
        if op.type in VARIABLE_TYPES or ctx.state.phase_of(op) is Phase.APPLY:
          graph_editor.set_device(op, _host(ctx, local, op))
          moved += 1
      for op in ops:
        if ctx.state.phase_of(op) not in (Phase.FORWARD, Phase.BACKWARD):
          continue
        variable_reads = {}
        for index, tensor in enumerate(op.inputs):
          variable = _variable_read(tensor.op, variables)
          if variable is not None and ctx.state.phase_of(
              tensor.op) is not Phase.APPLY:
            variable_reads[index] = variable
        if variable_reads and op.type not in VARIABLE_READ_TYPES:
          _read_just_in_time(ctx, op, variable_reads)
          reads += len(variable_reads)
  logger.info("offload v0: %d variable and update ops on the host CPU, %d "
              "variable reads made just before their consumers", moved, reads)
