"""``python -m chaos``: the drill service, running its drills in the local lab (the
default) or against a Kubernetes cluster's pods (``--target kubernetes``).

The drills (chaos/drills/) import neither the lab (chaos/lab/) nor the cluster's target
(chaos/kube/): this entry point is where they meet.
"""

from __future__ import annotations

import argparse
import sys

from chaos.drills.cli import main
from chaos.drills.service import RunDrill


def _lab_runner(args: argparse.Namespace) -> RunDrill:
    from chaos.lab.run import run_drill  # the lab, imported only when a drill runs

    return run_drill


def _kube_runner(args: argparse.Namespace) -> RunDrill:
    from chaos.kube.service import kube_run_drill  # the client, only for a cluster

    return kube_run_drill(args.topology, args.target_config)


if __name__ == "__main__":
    sys.exit(main({"lab": _lab_runner, "kubernetes": _kube_runner}))
