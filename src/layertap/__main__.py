"""``python -m layertap`` is the ``layertap`` command."""

from .cli.main import main

raise SystemExit(main())
