"""`pdbench submit`, `validate`, `render` and `doctor`'s pipeline, below the Typer layer.

check.py loads the recipe and computes its plan once, then checks it (the launcher can run
it, vLLM's parser takes its flags, this host sees its weights); pipeline.py renders a new run
directory and hands it to a launcher (harness.launch); follow.py shows a job to its end.
Errors are Refused (refused.py): a message and the exit code the CLI gives it.
"""
