"""The command line: a thin layer of tools over the Python API."""
