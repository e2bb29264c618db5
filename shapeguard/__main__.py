"""`python -m shapeguard`: the same command line as `shapeguard`."""

from ._cli import main

if __name__ == "__main__":
    main()
