"""``python -m vmr_handler`` is the same as the ``vmr-handler`` console script."""

from vmr_handler.agent.cli.commandline import main

raise SystemExit(main())
