"""Step timing shared by the benchmarks."""
import statistics
import time


def step_seconds(session, fetches, steps):
  """Seconds of each of `steps` runs of `fetches`, after one warm-up run."""
  session.run(fetches)
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    session.run(fetches)
    times.append(time.perf_counter() - start)
  return times


def median_step_seconds(session, fetches, steps):
  return statistics.median(step_seconds(session, fetches, steps))
