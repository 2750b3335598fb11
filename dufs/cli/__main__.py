"""``python -m dufs.cli``."""

from dufs.cli.app import main

if __name__ == "__main__":
    main()
