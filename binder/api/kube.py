"""The binder's one door to the Kubernetes API: `Kube`, the one object every part holds.

It gathers, over one common.kubeapi.session.Session (credentials, failures as ApiErrors, the writes'
retry policy), the calls of each area, each owned by its module: lists and watches
(binder.api.listwatch), pod writes and the Binding (binder.api.podwrites), TritonModel, scale,
Service and PodDisruptionBudget writes (binder.api.modelwrites), KServe's objects
(binder.api.kserve), Events
(common.kubeapi.eventrecorder), Leases (binder.api.leases) and Node writes (binder.api.nodewrites).
Blocking calls, meant to run on worker threads. No scheduling logic lives here.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from binder.api.kserve import KServe
from binder.api.leases import Leases
from binder.api.listwatch import ListWatch
from binder.api.modelwrites import ModelWrites
from binder.api.nodewrites import NodeWrites
from binder.api.podwrites import PodWrites
from binder.errors import SettingsError
from common.kubeapi.errors import KubeConfigError
from common.kubeapi.eventrecorder import EventRecorder
from common.kubeapi.kubeconfig import client_configuration, transport_for
from common.kubeapi.session import CONNECT_TIMEOUT_SECONDS, RetryPolicy, Session
from common.version import VERSION

USER_AGENT = f"tritonshare-binder/{VERSION}"


class Kube:
    """One session per process, shared by every thread, and each area's calls over it."""

    def __init__(
        self,
        kubeconfig: str | None,
        *,
        context: str | None = None,
        user_agent: str = USER_AGENT,
        pool_size: int = 32,
        retry: RetryPolicy,
        retry_while: Callable[[], bool] = lambda: True,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`kubeconfig`: a path (None: the in-cluster service account). Writes are retried under
        `retry` only while `retry_while()` holds (the binder gives "this replica leads")."""
        try:
            configuration = client_configuration(kubeconfig, context, pool_size)
            transport = transport_for(configuration, pool_size, user_agent, CONNECT_TIMEOUT_SECONDS)
        except KubeConfigError as e:
            raise SettingsError(str(e)) from e
        self.session = session = Session(
            configuration,
            transport,
            retry=retry,
            retry_while=retry_while,
            monotonic=monotonic,
        )
        self.read = session.read

        listwatch = ListWatch(session)
        self.list_all = listwatch.list_all
        self.watch = listwatch.watch
        self.close_watches = listwatch.close_watches

        pods = PodWrites(session)
        self.patch_pod_annotations = pods.patch_pod_annotations
        self.bind = pods.bind
        self.evict_pod = pods.evict_pod
        self.set_unschedulable = pods.set_unschedulable
        self.set_nominated_node = pods.set_nominated_node
        self.set_pod_condition = pods.set_pod_condition
        self.fail_pod = pods.fail_pod
        self.delete_pod = pods.delete_pod
        self.create_pod = pods.create_pod
        self.merge_patch_pod = pods.merge_patch_pod
        self.pods_on_node = pods.pods_on_node
        self.read_pod = pods.read_pod
        self.dry_run_create_pod = pods.dry_run_create_pod

        models = ModelWrites(session)
        self.patch_model_status = models.patch_model_status
        self.scale = models.scale
        self.create_service = models.create_service
        self.put_budget = models.put_budget
        self.put_config_map = models.put_config_map
        self.delete_budget = models.delete_budget
        self.create_model = models.create_model
        self.patch_model = models.patch_model

        kserve = KServe(session)
        self.patch_inferenceservice_status = kserve.patch_inferenceservice_status
        self.read_inferenceservice = kserve.read_inferenceservice
        self.read_inferenceservice_config = kserve.read_inferenceservice_config
        self.read_storage_config = kserve.read_storage_config
        self.create_storage_secret = kserve.create_storage_secret

        recorder = EventRecorder(session, action="Scheduling")
        self.record_event = recorder.record_event
        self.record_object_event = recorder.record_object_event

        leases = Leases(session)
        self.get_lease = leases.get_lease
        self.create_lease = leases.create_lease
        self.replace_lease = leases.replace_lease
        self.delete_lease = leases.delete_lease

        nodes = NodeWrites(session)
        self.patch_node_annotations = nodes.patch_node_annotations
        self.merge_patch_node = nodes.merge_patch_node

    @property
    def server(self) -> str:
        """The API server's URL, as the kubeconfig or the service account gave it."""
        return self.session.server

    def close(self) -> None:
        """End every watch and every write's retries, and close the connections."""
        self.close_watches()
        self.session.close()
