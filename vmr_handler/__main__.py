"""``python -m vmr_handler`` is the same as the ``vmr-handler`` console script."""

from vmr_handler.agent.cli import main

raise SystemExit(main())
