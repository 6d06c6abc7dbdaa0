"""Command-line entry points: the only modules that print or choose exit codes."""
