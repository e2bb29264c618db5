"""The `shapeguard` command line: loading a user's file, making its inputs, running
`trace`, `check` and `explain`, and the one-line errors for bad input.

The top layer: it imports everything below and nothing imports it.
"""
