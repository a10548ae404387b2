"""The rewrite engine: from the captured single-replica graph to the
distributed one, once, before the graph first runs.

The passes, in order (each a function with its own docstring):
  1. select_training_subgraph  - what is cloned, shared or joined
  2. resolve_training_ops      - TaskGraph and phase of every training op
  3. check_stages              - stages make a pipeline (errors only)
  4. make_plan                 - replicas and devices (plain data)
  5. place_replica_zero        - the user's ops become replica 0
  5a. convert_to_half        - AMP O1: half-precision compute
  5b. scale_loss             - AMP loss scale on the gradient seeds
  5c. recompute_activations  - gradient checkpointing (recomputation)
  6. clone_micro_batches       - forward + backward per micro-batch,
                                 gradients accumulated
  7. clone_replicas            - the other local replicas
  8. order_input_reads         - each micro-batch of each replica reads
                                 its own batch, in order
  9. join_replicas             - the train op waits for every replica
 10. aggregate_gradients       - all-reduce between gradients and update
 10a. skip_nonfinite_updates - AMP dynamic loss scale: skip inf/NaN steps
 11. schedule_pipeline         - each stage runs its micro-batches in the
                                 schedule's order
 12. merge_global_objects      - merged fetches
 13. VariableSync.update       - init / restore reach every replica
Later, before each run, VariableSync handles ops built since.
"""
import collections
import logging

from epl.env import Env
from epl.ir import capture
from epl.ir.resolve import resolve_training_ops
from epl.parallel import planner
from epl.parallel.context import RewriteContext
from epl.parallel.gradient_aggregation import (aggregate_gradients,
                                               gradient_points)
from epl.parallel.merge_outputs import merge_global_objects
from epl.parallel.micro_batches import clone_micro_batches
from epl.parallel.replicas import (clone_replicas, join_replicas,
                                   order_input_reads, place_replica_zero)
from epl.parallel.schedule import schedule_pipeline
from epl.parallel.stage_checks import check_stages
from epl.parallel.training_subgraph import select_training_subgraph
from epl.parallel.variable_sync import VariableSync
from epl.runtime.amp import convert_to_half
from epl.runtime.gradient_checkpoint import recompute_activations
from epl.runtime.loss_scale import scale_loss, skip_nonfinite_updates

logger = logging.getLogger("epl")


class RewriteResult:
  """What the rewrite left for the runtime and for inspection."""

  def __init__(self, ctx, variable_sync):
    self.context = ctx
    self.plan = ctx.plan
    self.substitutes = ctx.substitutes
    self.variable_sync = variable_sync
    self.graph_version = ctx.graph.version


def _log_plan(ctx):
  phases = collections.Counter(
      ctx.state.phase_of(op).value for op in ctx.subgraph.cloned)
  logger.info("EPL plan: %s", ctx.plan.describe())
  logger.info(
      "EPL rewrite: %d local replica(s) %s; per replica %d ops cloned (%s), "
      "%d shared, %d variables replicated", len(ctx.replicas), ctx.replicas,
      len(ctx.subgraph.cloned),
      ", ".join("%s %d" % kv for kv in sorted(phases.items())),
      len(ctx.subgraph.shared), len(ctx.subgraph.variables))


def rewrite(graph, state):
  """Runs the rewrite passes over `graph`; returns the RewriteResult."""
  env = Env.get()
  subgraph = select_training_subgraph(graph, state)
  resolve_training_ops(state, subgraph.cloned)
  check_stages(state, subgraph)
  plan = planner.make_plan(env.cluster, state.taskgraphs, env.config)
  ctx = RewriteContext(graph=graph, state=state, plan=plan, config=env.config,
                       cluster=env.cluster, subgraph=subgraph,
                       replicas=plan.local_replicas,
                       gradient_points=gradient_points(
                           env.config, state.gradient_records))
  with capture.suspended():
    place_replica_zero(ctx)
    convert_to_half(ctx)
    dynamic_loss_scale = scale_loss(ctx)
    recompute_activations(ctx)
    clone_micro_batches(ctx)
    clone_replicas(ctx)
    order_input_reads(ctx)
    join_replicas(ctx)
    aggregate_gradients(ctx)
    skip_nonfinite_updates(ctx, dynamic_loss_scale)
    schedule_pipeline(ctx)
    merge_global_objects(ctx)
    variable_sync = VariableSync(ctx)
    variable_sync.update()
  _log_plan(ctx)
  return RewriteResult(ctx, variable_sync)


def _state_to_rewrite(graph):
  if not Env.initialised():
    return None
  state = Env.get().graph_state(graph, create=False)
  if state is None or not state.gradient_records:
    return None
  return state


def ensure_rewritten(graph):
  """Rewrites `graph` once, if it holds captured training ops."""
  state = _state_to_rewrite(graph)
  if state is None:
    return None
  if state.rewrite_result is None:
    state.rewrite_result = rewrite(graph, state)
  return state.rewrite_result


def before_finalize(graph):
  ensure_rewritten(graph)


def before_run(graph):
  """Called before every Session.run: returns the fetch substitutes."""
  result = ensure_rewritten(graph)
  if result is None:
    return None
  if graph.version != result.graph_version and not graph.finalized:
    with capture.suspended():
      result.variable_sync.update()
    result.graph_version = graph.version
  return result.substitutes
