"""``python -m vmr_handler.host`` is the same as the ``vmr-host`` console script."""

from vmr_handler.host.cli.vmr_host import main

raise SystemExit(main())
