"""``python -m creditlab.cli``: the ``creditlab`` command."""

from creditlab.cli import main

if __name__ == "__main__":
    main()
