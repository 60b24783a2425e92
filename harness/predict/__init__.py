"""Predict before you run: per-role profiles fitted from a run's own points, a simulation of xP+yD
serving under closed-loop load, and predicted against measured for every point.

observe (result files -> Observations) -> fit (-> harness.rundir.perf_profile.PerfProfile, stored
in the run directory) -> model (profile + deployment + load -> Prediction, via simulate) ->
holdout (each point predicted from the others). docs/predict.md says how and how well.
"""
