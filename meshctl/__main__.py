"""`python -m meshctl` runs the CLI, for hosts where the console script is not on PATH."""

from meshctl.cli.app import main

main()
