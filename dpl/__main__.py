import sys

from dpl.cli import main

sys.exit(main())
