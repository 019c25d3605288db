"""Sticky sessions: which region serves one (``resolve``, pure), the adapter over the store
(``store``) and the shared expiry leases it uses (``leases``)."""
