"""``python -m chaos``: the drill service, running its drills in the local lab.

The drills (chaos/drills/) never import the lab (chaos/lab/): this entry point is where
the two meet, and the only drill target today is a local deployment the lab builds.
"""

from __future__ import annotations

import sys

from chaos.drills.cli import main
from chaos.drills.service import RunDrill


def _lab_runner() -> RunDrill:
    from chaos.lab.run import run_drill  # the lab, imported only when a drill runs

    return run_drill


if __name__ == "__main__":
    sys.exit(main(_lab_runner))
