"""`python -m streamtrain.cli ...`: the `streamtrain` command without its console script."""

from streamtrain.cli import main

main()
