"""Where the ranks of a run live: how many machines, which one this is, and node 0's address.

Checked before any process starts (`migrate.train.parallel_setup.layout_errors`) and
read by the launcher (`migrate.train.launch.msrun`) to build each node's msrun command.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cluster:
    """Where the ranks run: `nodes` machines, this one being `node_rank`."""

    nodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None   # None: 127.0.0.1 (one node only)
    master_port: int | None = None   # None: a free port on this machine (one node only)


def cluster_errors(cluster: Cluster, devices: int) -> list[str]:
    """Every rule the node options break, one line each."""
    errors = []
    if isinstance(cluster.nodes, bool) or not isinstance(cluster.nodes, int) or cluster.nodes < 1:
        return [f"--nodes must be a positive integer, got {cluster.nodes!r}"]
    if devices % cluster.nodes:
        errors.append(f"dp × mp × pp = {devices} ranks cannot be spread evenly over --nodes {cluster.nodes}")
    if not 0 <= cluster.node_rank < cluster.nodes:
        errors.append(f"--node-rank {cluster.node_rank} is outside 0..{cluster.nodes - 1} for --nodes {cluster.nodes}")
    if cluster.nodes > 1 and not cluster.master_addr:
        errors.append(f"--nodes {cluster.nodes} needs --master-addr (the address of node 0, reachable from every node)")
    if cluster.nodes > 1 and cluster.master_port is None:
        errors.append(f"--nodes {cluster.nodes} needs --master-port (the same free port on every node)")
    if cluster.master_port is not None and not 1024 <= cluster.master_port <= 65535:
        errors.append(f"--master-port must be in 1024..65535, got {cluster.master_port}")
    return errors
