"""The shared kernel: what every Tectonic process builds on (docs/architecture.md §8).

At its root the foundation (model, keys, codec, clock, version), records and keepers on
the store (audit, leases, watched prefixes), the topology (``config``) and a tick's
snapshot; beside it rooms that do not import each other: ``store/``, ``capacity/``,
``prefix/``, ``sessions/``, ``ladder/``, ``pool/``, ``vllm/``, ``rpc/``. It imports
nothing else of Tectonic; a layers contract in pyproject.toml keeps its floors."""
