import sys

from esol.cli import main

sys.exit(main())
