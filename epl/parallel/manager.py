"""The pass manager: rewrite passes declared by what they read and write.

A rewrite is a sequence of passes over one graph. Besides the graph itself
(which every pass edits) and the services of the rewrite context, passes
hand each other *artifacts*: named, typed values such as the training
subgraph, the copy map or the gradients to all-reduce. Each `Pass`
declares the artifacts it reads and those it writes; the manager

- checks the declarations when a pass is registered: every artifact read
  must be given to the rewrite or written by an earlier pass, and the
  pass's function must take exactly the artifacts it reads;
- orders the passes by the dependencies the declarations make: a pass runs
  after the last writer of each artifact it reads, and a writer after the
  readers of the value it replaces. Since each pass is checked against
  those registered before it, the registration order is such an order;
  among all of them the manager keeps it (a stable topological order), so
  the passes run as the engine lists them;
- runs the enabled passes in that order, handing each the values of the
  artifacts it reads as keyword arguments and storing the values it
  returns ({artifact: value}, exactly its writes);
- records which pass built each new op in the graph's provenance, and, with
  config key log.passes (environment EPL_LOG_PASSES=1), logs each pass at
  INFO: the ops it added and the time it took;
- after the rewrite, runs what each pass that ran declares it does later
  (`Pass.on_new_ops`, `Pass.on_feed`), over the final artifacts, so that
  the engine and the session name no pass.

Artifacts kept with the graph's state (op tags, provenance) and the plan
(made before the passes run) are declared like the others, for the order
and the diagram, but passes reach them through the context (`ctx.state`,
`ctx.plan`) rather than as arguments.
"""
import dataclasses
import functools
import inspect
import logging
import time
from typing import Callable, Optional, Tuple

logger = logging.getLogger("epl")


def always(ctx):  # pylint: disable=unused-argument
  """Always."""
  return True


@dataclasses.dataclass(frozen=True)
class Artifact:
  """A value passes hand each other: `name`, the type of its value and
  what it holds. `in_context`: reached through the rewrite context
  (`ctx.state`, `ctx.plan`), not passed as an argument."""
  name: str
  type_name: str
  doc: str
  in_context: bool = False


@dataclasses.dataclass(frozen=True)
class Pass:
  """One rewrite pass.

  `function(ctx, **reads)` gets the rewrite context and the values of the
  artifacts it reads and returns {artifact: value} for exactly the
  artifacts it writes (None when it writes none); artifacts reached
  through the context are neither passed nor returned. `enabled(ctx)` says
  whether it runs (from the plan's decisions, `ctx.plan.decisions`).

  What a pass that ran does later, each taking the rewrite context and the
  final values of artifacts the pass reads or writes (by parameter name):
  `on_new_ops(ctx, **artifacts)` before a Session.run when ops were built
  since the rewrite (or since its last call), for those ops;
  `on_feed(ctx, feed_dict, **artifacts)` before each Session.run that
  feeds values, to refuse a feed that cannot work.
  """
  name: str
  function: Callable
  reads: Tuple[str, ...] = ()
  writes: Tuple[str, ...] = ()
  enabled: Callable = always
  on_new_ops: Optional[Callable] = None
  on_feed: Optional[Callable] = None

  @property
  def summary(self):
    """The first paragraph of the function's docstring, on one line."""
    return _first_paragraph(self.function.__doc__)

  @property
  def condition(self):
    """When the pass runs: the first paragraph of `enabled`'s docstring."""
    return _first_paragraph(self.enabled.__doc__)


def _first_paragraph(doc):
  return " ".join((doc or "").strip().split("\n\n")[0].split())


# The later hooks of a pass: name -> how many leading arguments come before
# the artifacts (ctx; ctx and feed_dict).
LATER = {"on_new_ops": 1, "on_feed": 2}
# The hooks that build ops (the others only check).
_BUILDING = ("on_new_ops",)


@functools.lru_cache(maxsize=None)
def _hook_artifacts(hook, kind):
  """The artifacts later hook `hook` of kind `kind` takes, by name (read
  once: on_feed hooks run before every fed Session.run)."""
  return tuple(inspect.signature(hook).parameters)[LATER[kind]:]


class PassError(ValueError):
  """A pass declaration or result that does not fit the others."""


class PassManager:
  """Passes over named artifacts, ordered and run by their declarations."""

  def __init__(self, artifacts, given=()):
    """`artifacts`: every Artifact the passes may name; `given`: the names
    of those the rewrite starts with."""
    self._artifacts = {a.name: a for a in artifacts}
    unknown = [name for name in given if name not in self._artifacts]
    if unknown:
      raise PassError("Given artifacts %s are not declared." % unknown)
    self._given = tuple(given)
    self._passes = []

  @property
  def artifacts(self):
    return list(self._artifacts.values())

  @property
  def given(self):
    return self._given

  def register(self, pass_):
    """Adds `pass_` after the passes registered so far.

    Raises PassError for a name already taken, an undeclared artifact, a
    function whose parameters are not the context and the artifacts it
    reads, or an artifact read that neither the rewrite is given nor an
    earlier pass writes.
    """
    if any(p.name == pass_.name for p in self._passes):
      raise PassError("A pass named %r is registered already." % pass_.name)
    for name in pass_.reads + pass_.writes:
      if name not in self._artifacts:
        raise PassError("Pass %r names artifact %r, which is not declared "
                        "(artifacts: %s)." % (
                            pass_.name, name, ", ".join(self._artifacts)))
    parameters = list(inspect.signature(pass_.function).parameters)[1:]
    arguments = [name for name in pass_.reads
                 if not self._artifacts[name].in_context]
    if sorted(parameters) != sorted(arguments):
      raise PassError(
          "Pass %r: %s takes (ctx, %s) but the pass reads %s." % (
              pass_.name, pass_.function.__name__, ", ".join(parameters),
              ", ".join(arguments) or "no artifact passed as an argument"))
    self._check_later(pass_)
    available = set(self._given)
    for earlier in self._passes:
      available.update(earlier.writes)
    missing = [name for name in pass_.reads if name not in available]
    if missing:
      raise PassError(
          "Pass %r reads %s, which no earlier pass writes and the rewrite "
          "is not given. Register it after a pass that writes %s." % (
              pass_.name, ", ".join(repr(n) for n in missing),
              " and ".join(repr(n) for n in missing)))
    self._passes.append(pass_)

  def _check_later(self, pass_):
    """Each later hook of `pass_` takes, after its leading arguments, only
    artifacts the pass reads or writes (none reached through the
    context)."""
    own = [name for name in pass_.reads + pass_.writes
           if not self._artifacts[name].in_context]
    for kind in LATER:
      hook = getattr(pass_, kind)
      if hook is None:
        continue
      parameters = _hook_artifacts(hook, kind)
      foreign = [name for name in parameters if name not in own]
      if foreign:
        raise PassError(
            "Pass %r: its %s hook %s takes %s, which the pass neither reads "
            "nor writes (it may take %s)." % (
                pass_.name, kind, hook.__name__, ", ".join(foreign),
                ", ".join(own) or "no artifact"))

  def run_later(self, kind, ctx, artifacts, *arguments):
    """Runs hook `kind` ("on_new_ops" or "on_feed") of every enabled pass
    that has one, in pass order, over `artifacts` (what `run` returned),
    recording the ops each builds as that pass's in the provenance."""
    for pass_ in self.passes:
      hook = getattr(pass_, kind)
      if hook is None or not pass_.enabled(ctx):
        continue
      parameters = _hook_artifacts(hook, kind)
      values = {name: artifacts[name] for name in parameters}
      if kind not in _BUILDING:
        hook(ctx, *arguments, **values)
        continue
      with ctx.state.provenance.building(pass_.name, ctx.graph):
        hook(ctx, *arguments, **values)

  def dependencies(self):
    """{pass name: [(earlier pass name, artifact)]}: the writers whose
    values each pass reads (the edges of the architecture diagram)."""
    result = {}
    last_writer = {}
    for pass_ in self._passes:
      result[pass_.name] = [(last_writer[a], a) for a in pass_.reads
                            if a in last_writer]
      for artifact in pass_.writes:
        last_writer[artifact] = pass_.name
    return result

  @property
  def passes(self):
    """The registered passes in run order: the registration order, which
    `register` keeps a topological order of their dependencies."""
    return list(self._passes)

  def run(self, ctx, given, until=None):
    """Runs the enabled passes over `ctx`; returns {artifact: value} of
    every artifact given or written (those reached through the context
    excepted).

    `given`: {name: value} of the given artifacts not reached through the
    context. `until`: the name of the last pass to run (to look at the
    artifacts as that pass left them); all of them when None.
    """
    names = [p.name for p in self._passes]
    if until is not None and until not in names:
      raise PassError("No pass named %r is registered." % until)
    last = len(names) if until is None else names.index(until) + 1
    values = dict(given)
    written = set(self._given)
    log = ctx.config.log.passes
    for pass_ in self._passes[:last]:
      if not pass_.enabled(ctx):
        if log:
          logger.info("EPL pass %s: off (runs when %s)", pass_.name,
                      pass_.condition)
        continue
      missing = [name for name in pass_.reads if name not in written]
      if missing:
        raise PassError(
            "Pass %r reads %s, but the passes that write it did not run "
            "(their enabled(ctx) differs)." % (pass_.name, missing))
      arguments = {name: values[name] for name in pass_.reads
                   if not self._artifacts[name].in_context}
      ops_before = ctx.graph.version
      start = time.perf_counter()
      with ctx.state.provenance.building(pass_.name, ctx.graph):
        result = pass_.function(ctx, **arguments)
      seconds = time.perf_counter() - start
      result = {} if result is None else result
      returned = [name for name in pass_.writes
                  if not self._artifacts[name].in_context]
      if set(result) != set(returned):
        raise PassError("Pass %r returned %s; it declares it writes %s." % (
            pass_.name, sorted(result), sorted(returned)))
      values.update(result)
      written.update(pass_.writes)
      if log:
        logger.info("EPL pass %s: %d ops added, %.3f s", pass_.name,
                    ctx.graph.version - ops_before, seconds)
    return {name: value for name, value in values.items()
            if not self._artifacts[name].in_context}
