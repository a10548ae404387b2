"""The rewrite engine: from the captured single-replica graph to the
distributed one, once, before the graph first runs.

The passes, in order (each a function with its own docstring):
  1. select_training_subgraph      - what is cloned, shared or joined
  2. resolve_training_ops          - TaskGraph and phase of every op
  3. check_stages                  - stages make a pipeline (errors only)
  4. make_plan                     - replicas and devices (plain data)
  5. place_replica_zero            - the user's ops become replica 0
  6. convert_to_half               - AMP O1: half-precision compute
  7. scale_loss                    - AMP loss scale on the gradient seeds
  8. recompute_activations         - gradient checkpointing
  9. clone_micro_batches           - forward + backward per micro-batch,
                                     gradients accumulated
 10. zero.partition_updates        - ZeRO: each variable's owner; its
                                     update is not cloned
 11. clone_replicas                - the other local replicas
 12. vary_random_seeds             - each copy draws its own random numbers
 13. zero.place_updates            - ZeRO: updates run on their owners, new
                                     values copied to the other replicas
 14. offload_variables             - offload: state and updates on the
                                     host, variables read just in time
 15. order_input_reads             - each micro-batch of each replica reads
                                     its own batch, in order
 16. lower_split                   - each replica's copy of a split part
                                     becomes its shard
 17. split_fed_batches             - each copy reads its part of a fed batch
 18. join_replicas                 - the train op waits for every replica
 19. order_shared_writes           - the global_step increment runs once,
                                     after every replica read it
 20. average_forward_state_updates - batch-norm statistics move once per
                                     step by the replicas' mean update
 21. aggregate_gradients           - all-reduce between gradients and update
 22. skip_nonfinite_updates        - AMP dynamic loss scale: skip inf/NaN
                                     steps
 23. schedule_pipeline             - each stage runs its micro-batches in
                                     the schedule's order
 24. merge_global_objects          - merged fetches
 25. VariableSync.update           - init / restore reach every replica
Later, before each run, VariableSync handles ops built since. In a dry run
(`EPL_DRY_RUN`, `epl-plan`) the process prints the plan and exits once the
rewrite is done (`epl.hooks` calls `epl.tools.dry_run`).
"""
import collections
import logging

from epl.capture import capture
from epl.env import Env
from epl.ir.graph_state import state_of
from epl.passes import grouped_apply
from epl.passes import zero
from epl.passes.amp import convert_to_half
from epl.passes.context import RewriteContext
from epl.passes.fed_batches import split_fed_batches
from epl.passes.forward_state import average_forward_state_updates
from epl.passes.gradient_aggregation import (aggregate_gradients,
                                             gradient_points)
from epl.passes.gradient_checkpoint import recompute_activations
from epl.passes.loss_scale import scale_loss, skip_nonfinite_updates
from epl.passes.merge_outputs import merge_global_objects
from epl.passes.micro_batches import clone_micro_batches
from epl.passes.offload import offload_variables
from epl.passes.random_seeds import vary_random_seeds
from epl.passes.replicas import (clone_replicas, join_replicas,
                                 order_input_reads, place_replica_zero)
from epl.passes.resolve import resolve_training_ops
from epl.passes.schedule import schedule_pipeline
from epl.passes.shared_writes import order_shared_writes
from epl.passes.split import lower_split, update_checkpoints
from epl.passes.stage_checks import check_stages
from epl.passes.training_subgraph import select_training_subgraph
from epl.passes.variable_sync import VariableSync
from epl.plan import planner

logger = logging.getLogger("epl")


class RewriteResult:
  """What the rewrite left for the runtime and for inspection."""

  def __init__(self, ctx, variable_sync):
    self.context = ctx
    self.plan = ctx.plan
    self.substitutes = ctx.substitutes
    self.variable_sync = variable_sync
    self.graph_version = ctx.graph.version
    # Names of every op of the rewritten step (epl.runtime.coverage).
    self.covered_names = None


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


def rewrite(graph, state, subgraph):
  """Runs the rewrite passes over `graph`, whose training step is
  `subgraph`; returns the RewriteResult."""
  env = Env.get()
  resolve_training_ops(state, subgraph.cloned)
  check_stages(state, subgraph)
  plan = planner.make_plan(env.cluster, state.taskgraphs, env.config)
  ctx = RewriteContext(graph=graph, state=state, plan=plan, config=env.config,
                       cluster=env.cluster, subgraph=subgraph,
                       replicas=plan.local_replicas,
                       gradient_points=gradient_points(
                           env.config, state))
  grouped_apply.check_grouped(ctx)
  with capture.suspended():
    place_replica_zero(ctx)
    convert_to_half(ctx)
    dynamic_loss_scale = scale_loss(ctx)
    recompute_activations(ctx)
    clone_micro_batches(ctx)
    zero_partition = zero.partition_updates(ctx)
    clone_replicas(ctx)
    vary_random_seeds(ctx)
    zero.place_updates(ctx, zero_partition)
    offload_variables(ctx)
    order_input_reads(ctx)
    lower_split(ctx)
    split_fed_batches(ctx)
    join_replicas(ctx)
    order_shared_writes(ctx)
    average_forward_state_updates(ctx)
    aggregate_gradients(ctx)
    skip_nonfinite_updates(ctx, dynamic_loss_scale)
    schedule_pipeline(ctx)
    merge_global_objects(ctx)
    variable_sync = VariableSync(ctx)
    variable_sync.update()
  _log_plan(ctx)
  return RewriteResult(ctx, variable_sync)


def ensure_rewritten(graph):
  """Rewrites `graph` once, when it holds a training step under strategies:
  gradients recorded and variable updates built from them."""
  state = state_of(graph)
  if state is None or not state.taskgraphs or not state.gradient_records:
    return None
  if state.rewrite_result is None and state.version_without_step != (
      graph.version):
    subgraph = select_training_subgraph(graph, state)
    if not subgraph.updates:
      # Gradients without updates (yet): look again when the graph grows.
      state.version_without_step = graph.version
      return None
    state.rewrite_result = rewrite(graph, state, subgraph)
  return state.rewrite_result


def before_run(graph):
  """Called before every Session.run: returns the fetch substitutes."""
  result = ensure_rewritten(graph)
  if result is None:
    return None
  if graph.version != result.graph_version and not graph.finalized:
    with capture.suspended():
      result.variable_sync.update()
      update_checkpoints(result.context)
    result.graph_version = graph.version
  return result.substitutes
