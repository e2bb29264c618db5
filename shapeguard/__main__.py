"""`python -m shapeguard`: the same command line as `shapeguard`."""

from ._cli.commands import main

if __name__ == "__main__":
    main()
