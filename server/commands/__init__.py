"""The ``sharecoord`` command (docs/api.md#cli): one module per family of commands."""
