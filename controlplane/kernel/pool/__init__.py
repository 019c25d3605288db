"""The warm pool as etcd sees it: what an agent publishes (``members``) and replicas lent out
of rotation (``loans``)."""
