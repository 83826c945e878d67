"""`python -m streamtrain_cli ...`: the `streamtrain` command without its console script."""

from streamtrain_cli import main

main()
