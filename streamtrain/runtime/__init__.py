"""What every streamtrain process shares, whichever service it runs: its command line kit (`commands`: global
options, configuration errors as exit 2, logging, the service run loop) and its lifeline to the parent that
started it (`lifeline`: a child dies with its parent)."""
