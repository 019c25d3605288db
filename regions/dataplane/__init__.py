"""What the data plane shares: the gateway, the endpoint picker and the region agent build on
it and it builds on none of them. The prompt characters that route a request
(``prompts``), the replica ring (``ring``), admission control's limiter and its bound
(``admission_limit``, ``admission_bound``)."""
