"""Measurements that each run in a fresh Python process: their peak RSS
is their own, and nothing an earlier run built or cached is left.

A benchmark script calls `measure_in_child(script, arguments, timeout)`;
the child, started as `script --child <json arguments>`, hands its
arguments to the benchmark's measure function through
`answer_child(child_argument, measure)`, which prints the result as the
last line of its output.
"""
import json
import subprocess
import sys


def measure_in_child(script, arguments, timeout):
  """Runs `script --child <arguments as JSON>`; returns its result."""
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
