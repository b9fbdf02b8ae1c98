import sys

from migrate.cli import main

sys.exit(main())
