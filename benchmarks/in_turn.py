"""Runs of one process timed in turn, round by round.

On a host shared with other jobs a step's wall time follows the other
processes' load more than its own cost; two runs timed in processes of
their own, one after the other, mostly measure which had the cores to
itself. Built in one process and stepped in turn (one step of each run a
round, each round starting one run later, so that none always goes
first), steps a few tens of milliseconds to a few seconds apart see the
same load, and the ratio of two runs' steps in the same round says what
one costs against the other. Each round's load from other processes
(`host_load`) says which rounds had both cores.

A run may also live in a process of its own (`row_process`: each with
the process-wide TensorFlow settings its way of training wants), stepped
on command from this one: its step then returns its own (wall, CPU)
timing, measured in that process, and its pid keeps its CPU out of the
other processes' load.
"""
import statistics
import time

from benchmarks import host_load


def timed_step(step):
  """(wall s, process CPU s) of one call of `step`."""
  start, start_cpu = time.perf_counter(), time.process_time()
  step()
  return time.perf_counter() - start, time.process_time() - start_cpu


def rounds(runs, count, quiet_cores, self_timed=False, child_pids=()):
  """({name: [(wall s, CPU s) of each round's step]}, [whether each round
  was quiet: other processes kept under `quiet_cores` busy], cores other
  processes kept busy over all rounds (None without /proc/stat)) of
  `count` rounds of one call of each of `runs` ([(name, step callable)]),
  each round starting one run later. With `self_timed` each step returns
  its (wall s, CPU s), measured in the process that ran it, one of
  `child_pids` (not counted as other processes)."""
  others = host_load.OtherProcesses(child_pids)
  timed = {name: [] for name, _ in runs}
  quiet = []
  for round_index in range(count):
    start = round_index % len(runs)
    in_round = host_load.OtherProcesses(child_pids)
    for name, step in runs[start:] + runs[:start]:
      timed[name].append(tuple(step()) if self_timed else timed_step(step))
    in_round = in_round.cores()
    quiet.append(in_round is not None and in_round < quiet_cores)
  return timed, quiet, others.cores()


def median_ratio(pairs, base_pairs, field):
  """The median over the rounds of pairs[i][field] / base_pairs[i][field]
  (field 0: wall time, 1: CPU time), or None without rounds."""
  ratios = [p[field] / b[field] for p, b in zip(pairs, base_pairs)
            if b[field] > 0]
  return statistics.median(ratios) if ratios else None
