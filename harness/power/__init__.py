"""GPU power and energy: a sampler on every node (sampler.py), each point's energy and cost per
role from its samples (energy.py), node 0's accounting at each phase's end (account.py) and the
dcgm-power v1 package InferenceX's utils/aggregate_power_multinode.py reads (package.py)."""
