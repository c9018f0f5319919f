"""Solve: a pure function from demand, profiles and inventory to a verified Plan: candidates,
the capacity rule, greedy and MILP solvers, the lower bound, accuracy objectives, shortfalls."""
