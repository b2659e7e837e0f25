"""The pure format: names and keys, the column codec, exact JSON values, chunk encoding, step states.

Nothing here does I/O; everything is testable on bytes and dictionaries alone.
"""
