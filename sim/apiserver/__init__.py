"""An in-memory Kubernetes API server that the official `kubernetes` client talks to unchanged.

Serves Namespaces, Nodes (+status), Pods (+status, +binding), Events, Leases, ResourceQuotas
(+status, with the quota admission of pods), TokenRequest and
TokenReview, MutatingWebhookConfigurations and ValidatingAdmissionPolicies (+bindings),
CustomResourceDefinitions and their custom resources, with the real server's resourceVersion,
watch, conflict, selector, patch, graceful deletion and admission semantics, and kubectl's tables;
see docs/sim.md for exactly what is and is not implemented. Start it in a test
with `start_in_thread()`, or as a process with `python -m sim.apiserver --port P`.
"""

from sim.apiserver.audit import AuditLog, AuditRecord
from sim.apiserver.faults import Fault
from sim.apiserver.server import RunningApiServer, start_in_thread, write_kubeconfig
from sim.apiserver.settings import ApiServerSettings

__all__ = [
    "ApiServerSettings",
    "AuditLog",
    "AuditRecord",
    "Fault",
    "RunningApiServer",
    "start_in_thread",
    "write_kubeconfig",
]
