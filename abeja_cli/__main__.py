"""``python -m abeja_cli`` runs the same command as the ``abeja`` console script."""

from abeja_cli.main import abeja

if __name__ == "__main__":
    abeja(prog_name="abeja")
