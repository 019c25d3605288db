"""The local lab: etcd, processes, the vLLM CPU build, a whole local deployment, synthetic
replicas and the demo. Tests, benches and the demo build on it; the product never imports it."""
