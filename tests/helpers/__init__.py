"""Helpers the test modules share: fakes, job runners, builders of run directories.

Test modules import from here (and from conftest), never from one another;
tests/test_test_imports.py keeps it so.
"""
