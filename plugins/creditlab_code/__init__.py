"""creditlab_code plug-in: Python coding tasks with unit tests and a sandboxed verifier."""
