"""The shared kernel: what every Tectonic process builds on (docs/architecture.md §8).

The model, the etcd keys and codec, the store port and its adapters, the audit log,
leases, sessions, prefixes, the degradation ladder, the topology and security settings.
It imports nothing else of Tectonic: the control plane, the region agent, the gateway
and the drills build on it and not on each other (import-linter contracts)."""
