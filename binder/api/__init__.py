"""The binder's calls to the API server over the product's one door to it (common.kubeapi): the
typed client, leader election and the hand-offs between threads and the loop."""
