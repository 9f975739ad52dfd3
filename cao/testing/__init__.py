"""Test helpers shipped with cao: a fake model server for running the real agent CLIs offline."""
