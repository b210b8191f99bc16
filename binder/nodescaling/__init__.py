"""Node autoscaling: what the binder cannot place becomes pods Cluster Autoscaler and Karpenter act
on (placeholders), and nodes whose GPUs serve models are kept from their scale-down."""
