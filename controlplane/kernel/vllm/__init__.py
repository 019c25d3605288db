"""Reading a vLLM replica: its ``/metrics`` (``metrics``) and the window figures computed from
the cumulative counters (``signals``, pure)."""
