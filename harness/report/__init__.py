"""Reports and CI collection over run directories: tables (md/csv/html/json), Pareto plots and
the InferenceX-style aggregate JSON."""
