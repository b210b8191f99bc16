"""Placement as kube-scheduler decides it: the filters and scores, the algorithm that picks a node
and a GPU, preemption, consolidation, quotas and the scheduling queue."""
