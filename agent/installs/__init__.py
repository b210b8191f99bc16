"""A model's files on the node: the repository, the kept-files cache, the configuration checks and
the limits on them."""
