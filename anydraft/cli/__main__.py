import sys

from anydraft.cli import main

sys.exit(main())
