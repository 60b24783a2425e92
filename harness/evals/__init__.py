"""Accuracy evals: lm-eval run as a bounded subprocess against a phase's proxy (docs/accuracy.md)."""
