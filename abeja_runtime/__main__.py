"""``python -m abeja_runtime`` runs the same command as the ``abeja-runtime`` script."""

from abeja_runtime.main import cli

if __name__ == "__main__":
    cli()
