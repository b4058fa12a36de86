"""`python -m toolkit.fa4`: the FA4 verbs alone."""

from toolkit.fa4.cli import main

raise SystemExit(main())
