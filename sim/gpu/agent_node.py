"""A simulated GPU node's agent.

`python -m sim.gpu.agent_node --gpus SPEC [--faults FILE] -- <agent flags>`

installs the mock NVML (sim/gpu/nvml.py) as `sys.modules["pynvml"]`, then runs the agent's own main
with the flags after `--`, so the real GPU-reading code runs against the simulated GPUs. GPU UUIDs
are derived from the agent's `--node-name`, so every simulated node has its own. It adds nothing
to the agent's behaviour.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import kubernetes.client
import kubernetes.config

from agent.settings import DECLARATION as AGENT_SETTINGS
from common.settings import Declaration, Setting, path, quantity
from sim.cluster import USER_AGENT as CLUSTER_USER_AGENT
from sim.gpu.compute import GpuAssignments, node_dir
from sim.gpu.load import ModelFootprints
from sim.gpu.nvml import Spec, SpecError, install, load_events, parse_spec


class SettingsError(ValueError):
    """A flag of the simulated node (not of the agent) is missing or wrong."""


OWN_FLAGS = Declaration(
    "python -m sim.gpu.agent_node",
    "Run the tritonshare agent over simulated GPUs (mock NVML). Everything after `--` is passed "
    "to the agent (python -m agent --help).",
    [
        Setting(
            "gpus",
            "preset such as 2xT4, 8xA100-80GB, or a JSON/YAML spec",
            env=None,
            required="the simulated GPUs",
        ),
        Setting("faults", "JSON/YAML file with an 'events' timeline", path, env=None),
        Setting(
            "simulate-model-memory",
            "models READY in the agent's Triton occupy the GPU memory their config declares "
            "(parameter sim_gpu_memory; see sim/gpu/load.py)",
            env=None,
            switch=True,
        ),
        Setting(
            "gpu-compute",
            "with --simulate-model-memory, each GPU runs one request at a time for the models "
            "that ask (sim/gpu/compute.py): the GPU of each of the node's models is written in "
            "gpu-compute beside the model repository",
            env=None,
            switch=True,
        ),
        Setting(
            "process-context",
            "with --simulate-model-memory, bytes each model of a backend that runs in a process "
            "of its own (python) also holds, as its stub's CUDA context does on a real GPU",
            quantity(),
            env=None,
            default="0",
        ),
        Setting(
            "process-driver-share",
            "with --simulate-model-memory, bytes each such process also costs the GPU that NVML's "
            "per-process figure leaves out, as the driver's part of a CUDA context does",
            quantity(),
            env=None,
            default="0",
        ),
    ],
    error=SettingsError,
)


def _flag(agent_args: Sequence[str], name: str) -> str:
    """One of the agent's settings as the agent reads it (flag, variable, default), or ""."""
    return AGENT_SETTINGS.raw(agent_args, os.environ, name) or ""


def _node_name(agent_args: Sequence[str]) -> str:
    return _flag(agent_args, "node-name") or "node"


def _footprints(
    agent_args: Sequence[str], spec: Spec, process_context: int, driver_share: int
) -> ModelFootprints:
    """Model memory from the agent's own Triton, repository and cluster (its flags)."""
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=_flag(agent_args, "kubeconfig"),
        client_configuration=config,
    )
    name, _, value = _flag(agent_args, "triton-admin-header").partition(":")
    api = kubernetes.client.ApiClient(config)
    # The simulated hardware's reads, told apart from the agent's in the audit log.
    api.user_agent = f"{CLUSTER_USER_AGENT}/gpuload"
    return ModelFootprints(
        _flag(agent_args, "triton-http-url"),
        Path(_flag(agent_args, "model-repository")),
        api,
        _node_name(agent_args),
        {gpu.uuid: index for index, gpu in enumerate(spec.gpus)},
        admin_header=(name.strip(), value.strip()) if value else None,
        process_context=process_context,
        listed=True,
        driver_share=driver_share,
    )


def _assign_gpus(agent_args: Sequence[str], spec: Spec, root: Path) -> None:
    """Keep `root` told which GPU each of the node's models is on (`sim.gpu.compute`), from a
    daemon thread for the life of the process."""
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=_flag(agent_args, "kubeconfig"),
        client_configuration=config,
    )
    api = kubernetes.client.ApiClient(config)
    api.user_agent = f"{CLUSTER_USER_AGENT}/gpucompute"
    assignments = GpuAssignments(api, _node_name(agent_args), [g.uuid for g in spec.gpus], root)
    threading.Thread(
        target=assignments.run, args=(threading.Event(),), name="gpu-compute", daemon=True
    ).start()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" in args:
        split = args.index("--")
        own, agent_args = args[:split], args[split + 1 :]
    else:
        own, agent_args = args, []
    try:
        options = OWN_FLAGS.values(own, os.environ)
        spec = parse_spec(options["gpus"], seed=_node_name(agent_args))
        faults: Path | None = options.get("faults")
        if faults is not None:
            spec.events = sorted([*spec.events, *load_events(faults)], key=lambda e: e.at)
    except (SpecError, ValueError) as e:
        print(f"sim.gpu.agent_node: {e}", file=sys.stderr)
        return 2
    mock = install(spec)
    if options.get("simulate_model_memory"):
        footprints = _footprints(
            agent_args, spec, options["process_context"], options["process_driver_share"]
        )
        mock.set_workload(footprints, footprints.processes)
        if options.get("gpu_compute"):
            root = node_dir(Path(_flag(agent_args, "model-repository")))
            _assign_gpus(agent_args, spec, root)
    # Imported only now, so that agent.gpus.nvml binds the mock as `pynvml`.
    from agent.__main__ import main as agent_main

    return agent_main(agent_args)


if __name__ == "__main__":
    sys.exit(main())
