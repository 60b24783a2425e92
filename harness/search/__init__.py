"""`pdbench search`: a search over deployments under latency SLOs, each candidate a real job.
The confidence intervals are harness.interval's, shared with the SLO ladder inside each job.

spec.py: the search file (searches/<name>.yaml), loaded and checked.
space.py: the candidates (the factors' product, each planned; exclusions; the aggregated baseline).
search_dir.py: the search directory's paths and its state (state.json), one owner.
driver.py: runs the candidates as jobs within the budget, resumes a search, writes the report.
outcome.py: a candidate's outcome, read from its run directory.
prune.py: whether a candidate is worth running, given the finished ones.
decide.py: the winner per SLO.
report.py: report.md, report.json and the Pareto plot.
"""
