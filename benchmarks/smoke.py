"""The `--smoke` size every benchmark has: seconds, not minutes.

A benchmark lists the arguments of its smoke size and parses its command
line with `parse_args`; `--smoke` then stands for those arguments, and
arguments given beside it still win. tests/test_benchmarks.py runs every
benchmark at that size, so that one that stops working fails CI.
"""
import sys


def parse_args(parser, argv, smoke_argv):
  """Adds `--smoke` (= `smoke_argv`) to `parser` and parses `argv`."""
  parser.add_argument("--smoke", action="store_true",
                      help="seconds, not minutes (tests and CI): %s" %
                      " ".join(smoke_argv))
  argv = sys.argv[1:] if argv is None else list(argv)
  args = parser.parse_args(argv)
  if args.smoke:
    args = parser.parse_args(list(smoke_argv) + argv)
  return args
