"""Sharded operations that `epl.split` lowers user calls to."""
