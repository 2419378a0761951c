"""python -m perfsim.cli: the perfsim command."""

from perfsim.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
