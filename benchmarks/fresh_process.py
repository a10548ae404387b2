"""Measurements that each run in a fresh Python process: their peak RSS
is their own, and nothing an earlier run built or cached is left.

A benchmark script calls `measure_in_child(script, arguments, timeout)`;
the child, started as `script --child <json arguments>`, hands its
arguments to the benchmark's measure function through
`answer_child(child_argument, measure)`, which prints the result as the
last line of its output. With `in_process=measure` (the benchmarks'
`--in_process`, which their `--smoke` uses: seconds count there, not peak
RSS), `measure(*arguments)` runs in this process instead.
"""
import json
import subprocess
import sys


def measure_in_child(script, arguments, timeout, in_process=None):
  """Runs `script --child <arguments as JSON>`; returns its result (or
  `in_process(*arguments)`'s, when given)."""
  if in_process is not None:
    return json.loads(json.dumps(in_process(*arguments)))
  command = [sys.executable, script, "--child", json.dumps(arguments)]
  done = subprocess.run(command, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, timeout=timeout, check=False)
  if done.returncode:
    sys.stderr.write(done.stderr.decode()[-4000:])
    raise RuntimeError("%s %s failed (status %d)" % (
        script, arguments, done.returncode))
  return json.loads(done.stdout.decode().strip().splitlines()[-1])


def answer_child(child_argument, measure):
  """In the child: prints `measure(*arguments)` as JSON."""
  print(json.dumps(measure(*json.loads(child_argument))))
