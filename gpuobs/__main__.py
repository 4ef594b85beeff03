"""``python -m gpuobs`` = the ``gpuobs`` command."""

from gpuobs.cli import main

if __name__ == "__main__":
    main()
