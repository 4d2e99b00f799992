"""``python -m vmr_handler.host`` is the same as the ``vmr-host`` console script."""

from vmr_handler.host.cli import main

raise SystemExit(main())
