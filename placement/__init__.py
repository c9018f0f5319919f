"""GPU placement: the MIG/MPS catalogue, layout enumeration, the solver from profiles and
demand to a verified Plan, plan diffs, and the executors that apply a plan."""
