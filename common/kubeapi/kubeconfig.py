"""Where a part finds its API server: the kubeconfig or the in-cluster service account, read by
the `kubernetes` package (the only product module importing it), and the one transport
(common.kubeapi.transport) that reaches the server it names.

The `kubernetes` package only reads these settings and refreshes the token (the configuration's
`auth_settings()`, which common.kubeapi.session calls); no request goes through its client. Bad or
missing settings are KubeConfigErrors that say where they were read from.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any
from urllib.parse import urlsplit

import kubernetes.client
import kubernetes.client.rest
import kubernetes.config

from common.kubeapi.errors import KubeConfigError
from common.kubeapi.transport import Connections, Direct, Proxied, Transport

log = logging.getLogger(__name__)


def client_configuration(kubeconfig: str | None, context: str | None, pool_size: int) -> Any:
    """The client configuration from `kubeconfig` (a KUBECONFIG-style list of files, a:b, merged
    as kubectl merges them) and its `context`, or from the in-cluster service account when no
    kubeconfig is given."""
    loader: Any = kubernetes.config
    result = kubernetes.client.Configuration()
    try:
        if kubeconfig:
            loader.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=result
            )
        else:
            loader.load_incluster_config(client_configuration=result)
    except (kubernetes.config.ConfigException, OSError, ValueError) as e:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
        if context:
            where += f", context {context}"
        raise KubeConfigError(
            f"cannot configure the Kubernetes client from {where}: {e}; pass --kubeconfig "
            f"(or KUBECONFIG) outside a cluster"
        ) from e
    result.connection_pool_maxsize = pool_size
    return result


def transport_for(
    configuration: Any, keep: int, user_agent: str, connect_timeout: float
) -> Transport:
    """The one transport for every request, from the client configuration the kubeconfig (or the
    service account) filled in: the same server, CA, client certificate, SNI and proxy settings.
    Our own connections (`Direct`), unless a proxy applies to the server: then
    the urllib3 proxy manager the official client would use."""
    try:
        return _transport(configuration, keep, user_agent, connect_timeout)
    except (OSError, ssl.SSLError) as e:
        raise KubeConfigError(f"cannot set up TLS to the API server: {e}") from e


def _transport(configuration: Any, keep: int, user_agent: str, connect_timeout: float) -> Transport:
    url = urlsplit(configuration.host)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise KubeConfigError(f"the API server's URL {configuration.host!r} is not http(s)://host")
    if configuration.proxy and not kubernetes.client.rest.should_bypass_proxies(
        configuration.host, configuration.no_proxy or ""
    ):
        pool = kubernetes.client.rest.RESTClientObject(configuration).pool_manager
        log.info(
            "Talking to the API server at %s through the proxy %s.",
            configuration.host,
            configuration.proxy,
        )
        return Proxied(pool, configuration.host, user_agent)
    tls = None
    if url.scheme == "https":
        if configuration.verify_ssl:
            tls = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
            if configuration.assert_hostname is False:
                tls.check_hostname = False
        else:
            tls = ssl.create_default_context()
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE
        if configuration.cert_file:
            tls.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    port = url.port or (443 if url.scheme == "https" else 80)
    connections = Connections(
        url.hostname,
        port,
        tls=tls,
        server_hostname=configuration.tls_server_name or url.hostname,
        connect_timeout=connect_timeout,
        keep=keep,
    )
    return Direct(connections, url.path.rstrip("/"), url.netloc, user_agent)


def kubeconfig_namespace(kubeconfig: str, context: str | None = None) -> str | None:
    """The namespace the kubeconfig's `context` (default: its current context) names, as kubectl
    reads it; None when it names none. Raises KubeConfigError for an unreadable kubeconfig or an
    unknown context."""
    try:
        loader: Any = kubernetes.config
        contexts, current = loader.list_kube_config_contexts(config_file=kubeconfig)
    except (kubernetes.config.ConfigException, OSError, ValueError) as e:
        raise KubeConfigError(f"cannot read kubeconfig {kubeconfig}: {e}") from e
    if context:
        chosen = next((c for c in contexts if c.get("name") == context), None)
        if chosen is None:
            names = ", ".join(sorted(str(c.get("name")) for c in contexts)) or "none"
            raise KubeConfigError(
                f"context {context!r} is not in kubeconfig {kubeconfig} (it has: {names})"
            )
    else:
        chosen = current
    namespace = (chosen or {}).get("context", {}).get("namespace")
    return str(namespace) if namespace else None
