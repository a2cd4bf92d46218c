"""``python -m aioinfer``: command-line entry point."""

from aioinfer.entrypoints.cli import main

if __name__ == "__main__":
    main()
