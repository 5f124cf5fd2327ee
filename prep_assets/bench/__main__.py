"""`python -m prep_assets.bench ...`"""

import sys

from prep_assets.bench import main

sys.exit(main())
