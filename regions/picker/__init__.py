"""Tectonic's endpoint picker for Envoy (ext_proc, the Gateway API Inference Extension protocol)."""
