"""The parallel transformation: the planner (`plan`), the cost model
(`cost`), the sharded ops (`ops`), the rewrite passes (`passes`), the pass
manager (`manager`) and the engine that runs them (`engine`, the original
EPL's parallel.py)."""
