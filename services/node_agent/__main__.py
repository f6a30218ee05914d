"""``python -m services.node_agent`` is ``mtc-agent``."""

from services.node_agent.cli import main

raise SystemExit(main())
