"""A step's trace on disk: `serialize` (closed-schema JSON + safetensors, record types by stable name, never
unpickled), `check` (every record's shapes against its declared ones) and `captured` (a step captured from a
live TRL run, and the check that this package's TRL matches the one that wrote it).
"""
