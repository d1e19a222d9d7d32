"""`python -m accelerate_inorder_fix`: the same command line as `accelerate-inorder-fix`."""

import sys

from .cli.main import main


sys.exit(main())
