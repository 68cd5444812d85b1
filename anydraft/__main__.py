"""`python -m anydraft ...`: the same command as `anydraft ...` (anydraft/cli), for an environment whose scripts
folder is not on PATH."""
import sys

from anydraft.cli import main

sys.exit(main())
