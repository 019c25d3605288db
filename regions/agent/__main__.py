"""``python -m regions.agent``: the region agent (``--help`` lists its flags)."""

from regions.agent.cli import main

if __name__ == "__main__":
    main()
