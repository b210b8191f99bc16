"""The one door to the Kubernetes API server for every part that talks to it (the agent and the
binder): where the server is (`kubeconfig`), one transport to it (`transport`), one request with
its credentials and its failures as `errors` (`session`). The parts add their own typed calls on
top (binder.api, agent.kube)."""
