"""`python -m gpusession.cli`: the `gpusession` command."""
from .main import main

raise SystemExit(main())
