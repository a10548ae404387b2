"""Planning: replicas, devices and schedule as plain data, the balance of
variables over devices, and the automatic cut into pipeline stages."""
