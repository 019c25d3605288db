"""Bearing capacity: the probe's model of a replica (``bearing``), the record stored per region
(``record``) and the serving configuration it was measured under (``serving``). Pure."""
