"""``python -m quorumlog`` runs the CLI."""

from quorumlog.cli import main

main()
